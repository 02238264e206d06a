"""A fault-injecting OpenAI-compatible upstream for tests, the demo and benchmarks."""

from ballast.sim.app import create_app
from ballast.sim.behaviour import Behaviour, parse_behaviour
from ballast.sim.server import SimServer, run_sim, start_sim

__all__ = ["Behaviour", "SimServer", "create_app", "parse_behaviour", "run_sim", "start_sim"]
