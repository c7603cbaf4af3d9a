"""The short names `--model` takes for catalog models (`70b` -> Llama-3.1-70B), apart from the catalog itself so
the CLI can print them in its help without loading the catalog (start-up time; topoplan.models reads them)."""

from __future__ import annotations

ALIASES: dict[str, str] = {
    "7b": "Llama-2-7B", "13b": "Llama-2-13B", "8b": "Llama-3.1-8B", "70b": "Llama-3.1-70B",
    "405b": "Llama-3.1-405B", "mixtral": "Mixtral-8x7B", "8x7b": "Mixtral-8x7B", "qwen-72b": "Qwen2.5-72B",
    "72b": "Qwen2.5-72B", "deepseek-v3": "DeepSeek-V3", "dsv3": "DeepSeek-V3",
    "8x22b": "Mixtral-8x22B", "qwen3-235b": "Qwen3-235B-A22B", "235b": "Qwen3-235B-A22B",
}
ALIAS_HELP = ", ".join(f"{k} -> {v}" for k, v in ALIASES.items())
