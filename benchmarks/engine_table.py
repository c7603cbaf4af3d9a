"""Print the engine validation table of docs/engines.md from tests/engine_cases.py: every published row
priced by its engine's profile, fitting and checking rows apart, with the error per engine.

    python benchmarks/engine_table.py [--all]     (--all: also rows outside the model's scope)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_cases import INTERFERENCE_LIMIT, engine_rows, in_scope  # noqa: E402


def main() -> None:
    rows = engine_rows()
    show_all = "--all" in sys.argv
    print("| role | GPU | model | engine (measured) | profile | TP/PP | batch | prompt/gen | measured TPOT ms | "
          "predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r.role != "fit", r.engine, r.model, r.prompt, r.gen, r.batch, r.layout.tp)):
        if not in_scope(r) and not show_all:
            continue
        role = r.role if in_scope(r) else f"out ({100 * r.prefill_share:.0f}% prefill)"
        print(f"| {role} | {r.gpu} | {r.model} {r.dtype} | {r.engine} | {r.profile} | {r.layout.tp}/{r.layout.pp} | "
              f"{r.batch} | {r.prompt}/{r.gen} | {r.measured:.2f} | {r.predicted:.2f} | {100 * r.error:+.0f}% |")
    print()
    print(f"| profile | fit rows | fit RMS | check rows | check RMS | check worst | within 15% | out of scope "
          f"(> {100 * INTERFERENCE_LIMIT:.0f}% prefill) |")
    print("|---|---|---|---|---|---|---|---|")
    for profile in sorted({r.profile for r in rows}):
        mine = [r for r in rows if r.profile == profile]
        fit = [r for r in mine if r.role == "fit" and in_scope(r)]
        check = [r for r in mine if r.role == "check" and in_scope(r)]
        rms = lambda xs: 100 * math.sqrt(sum(r.error ** 2 for r in xs) / len(xs)) if xs else 0.0  # noqa: E731
        worst = max(check, key=lambda r: abs(r.error)) if check else None
        within = sum(abs(r.error) <= 0.15 for r in check)
        print(f"| {profile} | {len(fit)} | {rms(fit):.1f}% | {len(check)} | {rms(check):.1f}% | "
              f"{100 * worst.error:+.0f}% | {within}/{len(check)} | {sum(not in_scope(r) for r in mine)} |"
              if worst else f"| {profile} | {len(fit)} | {rms(fit):.1f}% | 0 | - | - | - | - |")


if __name__ == "__main__":
    main()
