"""What a drafter made of drafters passes on to all of them: reset, cache sizing, the target's features."""

from __future__ import annotations

import torch

from decoding.drafters.base import Drafter
from decoding.pass_costs import PassCosts


class DrafterGroup(Drafter):
    def __init__(self, drafters: list[Drafter], sep: str) -> None:
        if not drafters:
            raise ValueError(f"a {type(self).__name__} needs at least one drafter")
        self.drafters = drafters
        self.name = sep.join(d.name for d in drafters)

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()

    def fit(self, costs: PassCosts) -> None:
        for d in self.drafters:
            d.fit(costs)

    def prepare(self, max_seq_len: int) -> None:
        for d in self.drafters:
            d.prepare(max_seq_len)

    @property
    def cost_per_token(self) -> float:
        return max(d.cost_per_token for d in self.drafters)

    @property
    def max_nodes(self) -> int:
        return max(d.max_nodes for d in self.drafters)

    @property
    def uses_features(self) -> bool:
        return any(d.uses_features for d in self.drafters)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        layers = {d.feature_layers for d in self.drafters if d.uses_features}
        if len(layers) > 1:
            raise ValueError(f"drafters in one group read different target layers: {sorted(layers)}")
        return layers.pop() if layers else ()

    def observe_features(self, start: int, features: torch.Tensor) -> None:
        for d in self.drafters:
            if d.uses_features:
                d.observe_features(start, features)
