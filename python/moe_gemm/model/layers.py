"""The MoE layer sizes chapter 08 measures, defined once: three real models' expert layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerShape:
    """An MoE feed-forward layer: ``experts`` SwiGLU experts of width ``intermediate`` on ``hidden``,
    ``top_k`` per token."""

    label: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    def fields(self, tokens: int) -> dict[str, Any]:
        """What every layer record carries. The routing is the router's own (random weights), not a
        skew parameter: skew is recorded as NaN."""
        return {"hidden": self.hidden, "intermediate": self.intermediate, "experts": self.experts,
                "top_k": self.top_k, "tokens": tokens, "skew": float("nan")}


LAYERS = {
    "mixtral": LayerShape("Mixtral-8x7B-like", 4096, 14336, 8, 2),
    "qwen3": LayerShape("Qwen3-30B-A3B-like", 2048, 768, 128, 8),
    "deepseek": LayerShape("DeepSeek-V3-like", 7168, 2048, 256, 8),
}
