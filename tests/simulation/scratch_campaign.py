import sys, logging, json
sys.path.insert(0, "tests/simulation"); sys.path.insert(0, "tests/support")
logging.disable(logging.WARNING)
from logstore.guards import GUARDS
from dsim.mutation import hunt, candidates
names = sys.argv[3:] or list(GUARDS)
light, full = int(sys.argv[1]), int(sys.argv[2])
for name in names:
    h = hunt(name, candidates(light, full))
    print(json.dumps({"guard": name, "catch": h.catch.line() if h.catch else None, "tried": h.tried, "s": round(h.seconds,1), "found": h.found}), flush=True)
