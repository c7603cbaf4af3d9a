"""Mutated real pastes: the readers either parse them or raise TopoplanError, never anything else.

Bounded example counts keep this to a few seconds on a shared 2-core CI runner.
"""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topoplan.errors import TopoplanError
from topoplan.topology.p2p_text import parse_p2p_text
from topoplan.topology.smi_text import parse_topo_text

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
PASTES = [p.read_text() for p in sorted(TOPO.glob("*.txt")) if ".measured" not in p.name and ".p2p" not in p.name]
P2P = [(TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt").read_text(),
       "nvidia-smi topo -p2p w\n \tGPU0\tGPU1\t\n GPU0\tX\tCNS\t\n GPU1\tCNS\tX\t\n"]
# Characters a damaged paste plausibly gains: cell text, separators, escapes, junk.
NOISE = st.sampled_from(list("X \t\n-,0123456789NVSYOCPIXHBDE/A|[m\x1b\x00é") + ["NV12", "SYS", "GPU0", "N/A", "  "])


@st.composite
def mutated(draw, texts):
    """A real paste after a few random edits of the kinds pastes really suffer."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 4))):
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "drop", "insert", "detab", "truncate"]))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "detab":
            lines[i] = lines[i].replace("\t", " " * draw(st.integers(1, 8)))
        elif kind == "truncate":
            text = text[: draw(st.integers(0, len(text)))]
            continue
        else:
            line = lines[i]
            at = draw(st.integers(0, len(line)))
            if kind == "drop":
                lines[i] = line[:at] + line[at + draw(st.integers(1, 6)):]
            else:
                lines[i] = line[:at] + draw(NOISE) + line[at:]
        text = "\n".join(lines)
    return text


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(PASTES))
def test_topo_parser_raises_only_topoplan_error(text):
    try:
        topo = parse_topo_text(text, "fuzz.txt")
    except TopoplanError as error:
        assert error.source == "fuzz.txt" and error.line is not None and error.message
        return
    # Whatever was accepted is a complete matrix: every GPU pair linked once, codes normalised.
    n = len(topo.gpus)
    assert n and all(g.id == f"GPU{g.index}" for g in topo.gpus)
    gpu_pairs = [l for l in topo.links() if l.a.startswith("GPU") and l.b.startswith("GPU")]
    assert len(gpu_pairs) == n * (n - 1) // 2
    assert all(link.code != "SOC" for link in topo.links())


@settings(max_examples=100, deadline=None, derandomize=True)
@given(mutated(P2P))
def test_p2p_parser_raises_only_topoplan_error(text):
    try:
        parse_p2p_text(text, "fuzz.p2p.txt")
    except TopoplanError as error:
        assert error.source == "fuzz.p2p.txt" and error.line is not None
