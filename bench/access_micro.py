import asyncio, os, sys, tempfile, time, gc
from pathlib import Path
sys.path.insert(0, "bench"); sys.path.insert(0, "src")
import targets as tg
from procs import ProcessGroup
import cpu
import uvloop

async def run(config, key):
    from ballast.app import BallastApp
    from ballast.config import Settings
    from ballast.api.openai import parse_request
    app = BallastApp(Settings.model_validate(config))
    await app.startup()
    access = next(o for o in gc.get_objects() if type(o).__name__ == "Access")
    body = b'{"model": "bench-model", "stream": false, "messages": [{"role": "user", "content": "hi"}]}'
    sc = cpu.scope(body, key)
    usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
    n = 20000
    for phase in range(3):
        t0 = time.process_time()
        for _ in range(n):
            req = parse_request("/chat/completions", body)
            ticket = await access.admit(sc, req)
            h = ticket.lease.headers
            access.settle(ticket, "bench-model", usage, None)
        t1 = time.process_time()
        await access.spend.flush()
        t2 = time.process_time()
        await asyncio.sleep(0.1)
        print(f"admit+settle {(t1-t0)*1e6/n:.1f} us/req, flush {(t2-t1)*1e6/n:.1f} us/req")
    await app.shutdown()

procs = ProcessGroup()
workdir = Path(tempfile.mkdtemp(prefix="ballast-cpu-"))
os.chdir(workdir)
try:
    up = tg.start_nginx(procs, workdir)
    redis = sys.argv[1] if len(sys.argv) > 1 else None
    extra = tg.keys_config(workdir, "cpu", redis)
    key = tg.create_key(workdir, up, extra)
    uvloop.run(run(tg.ballast_config(0, up, extra), key))
finally:
    procs.stop_all()
