"""Print the predicted-vs-published table of docs/planner.md from tests/validation_cases.py.

    python benchmarks/validation_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.validation_cases import allreduce_rows, busbw_rows, ft_13b_rows, ft_gpt20b_rows, mixtral_rows  # noqa: E402


def main() -> None:
    print("| case | quantity | predicted | published | error |")
    print("|---|---|---|---|---|")
    for rows in (ft_gpt20b_rows(), ft_13b_rows(), allreduce_rows(), busbw_rows(), mixtral_rows()):
        for r in rows:
            print(f"| {r.case} | {r.quantity} | {r.predicted:.1f} | {r.published:g} | {100 * r.error:+.0f}% |")


if __name__ == "__main__":
    main()
