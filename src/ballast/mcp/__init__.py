"""The MCP gateway: `/mcp` in front of many tool servers, with sessions that heal."""
