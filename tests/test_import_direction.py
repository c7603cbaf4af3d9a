"""Lower layers never import higher ones, and no two modules import each other (design.md, "The pipeline").

Read from the source with `ast`, every import counted, also those inside functions: a lazy import still
ties the lower layer to the higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "topoplan"

# Each package (or top-level module) may import only the ones listed (and itself); whatever is not named
# here is a shared base module (errors, layout, dtypes, cpuset, ...) that imports no topoplan layer above it.
ALLOWED = {
    "topology": {"base"},
    "hardware": {"base", "topology"},
    "machine": {"base", "topology", "hardware"},
    "models": {"base"},
    "engines": {"base"},  # what each engine is, as data: read by plan, launch and bench, imports none of them
    "plan": {"base", "topology", "hardware", "machine", "models", "engines"},
    # launch writes the bundled runner's command line from the shared run options (topoplan.run_options), and
    # never imports the runner itself
    "launch": {"base", "topology", "hardware", "machine", "models", "engines", "plan"},
    "runner": {"base", "topology", "hardware", "models", "engines"},  # shared schedule facts: topoplan.layout
    # bench measures launched engines (calibrate/validate --engine vllm start vLLM through launch's script)
    "bench": {"base", "topology", "hardware", "machine", "models", "engines", "plan", "launch", "runner"},
    # doctor reads the machine (topology's NVML asker and sysfs helpers); --for places a layout as launch does
    "doctor": {"base", "topology", "hardware", "machine", "plan"},
}
BASE = {"errors", "layout", "dtypes", "cpuset", "atomic", "jsonfile", "rank_env", "terminal", "limits", "hf_fields",
        "vendors", "run_options", "model_aliases", "option_fields", "architectures"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every topoplan module `path` imports (absolute or relative, at any depth)."""
    found = set()
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            target = ".".join(filter(None, (base, node.module)))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import module`
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules and name != module_name(path)}


def graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in PACKAGE.rglob("*.py"):
        for target in imports_of(path):
            g.add_edge(module_name(path), target)
    return g


def layer(module: str) -> str:
    """`topoplan.plan.cost` -> "plan"; `topoplan.runner.builtin` -> "runner.builtin" where that matters."""
    parts = module.split(".")[1:]
    if not parts:
        return "base"  # the package's __init__: its version string, nothing else
    if parts[0] in ("cli", "__main__", "cli_options"):
        return "cli"
    if parts[0] in BASE:
        return "base"
    if len(parts) > 1 and f"{parts[0]}.{parts[1]}" in ALLOWED["launch"]:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def allowed(source: str, target: str) -> bool:
    a, b = layer(source), layer(target)
    if a == "cli" or a == b or b == "base" and a != "base" or b.split(".")[0] == a.split(".")[0]:
        return True
    if a == "base":
        return b == "base"
    return b in ALLOWED[a.split(".")[0]] or b.split(".")[0] in ALLOWED[a.split(".")[0]]


def test_no_import_goes_up_a_layer():
    wrong = sorted(f"{a} -> {b}" for a, b in graph().edges if not allowed(a, b))
    assert wrong == []


def test_no_import_circle():
    assert list(nx.simple_cycles(graph())) == []


def test_the_rules_catch_what_the_issue_named():
    """The checker itself: the imports issue 10 found would be flagged."""
    assert not allowed("topoplan.runner.local", "topoplan.launch.binding")
    assert not allowed("topoplan.topology.recording", "topoplan.hardware")
    assert not allowed("topoplan.plan.cost", "topoplan.runner.dist")
    assert not allowed("topoplan.layout", "topoplan.plan.rank")
    assert not allowed("topoplan.engines.vllm", "topoplan.plan.cost")
    assert not allowed("topoplan.engines", "topoplan.launch.command")
    assert allowed("topoplan.launch.command", "topoplan.run_options")
    assert not allowed("topoplan.launch.command", "topoplan.runner.builtin")  # launch never imports the runner
    assert not allowed("topoplan.runner.config", "topoplan.plan.layouts")  # nor the runner the planner
