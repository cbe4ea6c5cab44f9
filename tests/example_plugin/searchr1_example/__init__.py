"""An example third-party plugin package for searchr1.

It ships a search provider (``echo``: returns the query back as a document, and counts
calls) and a reward (``no_repeat``: a shaping term, -0.5 when a trajectory sends the same
query twice, else 0). Install it next to searchr1 and select them in config.toml (the term
is added to the default reward)::

    [search]
    provider = "echo"

    [reward]
    terms = ["no_repeat"]
"""

from __future__ import annotations

from searchr1.sdk import RewardResult, SearchResponse, SearchResult, hookimpl


class EchoSearch:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.calls = 0

    async def search(self, query: str, top_k: int) -> SearchResponse:
        self.calls += 1
        return SearchResponse(results=(SearchResult(title="echo", text=f"{self.prefix}{query}"),))

    def metrics(self, reset: bool = False) -> dict[str, float]:
        out = {"calls": float(self.calls), "success_rate": 1.0, "error_rate": 0.0}
        if reset:
            self.calls = 0
        return out

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


class NoRepeatReward:
    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, trajectory, golden_answers) -> RewardResult:
        queries = [t.query for t in trajectory.turns if t.query]
        repeated = len(queries) != len(set(queries))
        return RewardResult(
            reward=-self.penalty if repeated else 0.0, components={"repeated": float(repeated)}
        )


@hookimpl
def register_search_providers(register):
    register(
        "echo", lambda config: EchoSearch(config.plugin_table("search", "echo").get("prefix", ""))
    )


@hookimpl
def register_rewards(register):
    register("no_repeat", lambda config: NoRepeatReward(0.5))
