"""Where the suite's CPU goes: `DDPTUI_TEST_COST=FILE bin/test` writes a line a test, then
`python -m tests.cost FILE [N]` prints the N costliest tests and modules by CPU seconds (the
pytest process's own and the processes it waited for), with their wall time."""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    n = int(argv[1]) if len(argv) > 1 else 30
    try:
        with open(argv[0]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"tests.cost: cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"tests.cost: {argv[0]} holds no test's line")
        return 1
    cpu = lambda r: r["self_cpu"] + r["children_cpu"]  # noqa: E731
    total = sum(cpu(r) for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s ({sum(r['children_cpu'] for r in rows):.0f} in processes they "
          f"started), {sum(r['wall'] for r in rows):.0f} s of test wall time")
    print(f"\n{'CPU-s':>7} {'wall s':>7}  test")
    for r in sorted(rows, key=cpu, reverse=True)[:n]:
        print(f"{cpu(r):7.1f} {r['wall']:7.1f}  {r['test']}")
    mods: dict = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        m = mods[r["test"].split("::")[0]]
        m[0] += cpu(r)
        m[1] += r["wall"]
    print(f"\n{'CPU-s':>7} {'wall s':>7}  module")
    for name, (c, w) in sorted(mods.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"{c:7.1f} {w:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # (piped into head)
        sys.stderr.close()
        sys.exit(0)
