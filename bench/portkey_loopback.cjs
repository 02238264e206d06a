// Preloaded into Portkey's gateway by the bench (node --require): its server listens on
// every interface and has no option for a host, so every listen() without one binds
// loopback only.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && (args[1] === undefined || typeof args[1] === "function")) {
    if (args[1] === undefined) args[1] = "127.0.0.1";
    else args.splice(1, 0, "127.0.0.1");
  } else if (args[0] && typeof args[0] === "object" && !args[0].host && !args[0].path) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
