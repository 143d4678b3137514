"""Our ``prefix_merging`` against NeMo Gym's, on the same calls: the records through ours, their exported
``TokenEntry`` records (:mod:`.tokens`) through Gym's (nemo-gym 0.7.0 ``token_id_capture/builder.py``).

Both reduce a chain to one token sequence and a loss mask: context (the first prompt, then each call's
interstitial) masked, sampled ids trainable. :func:`cross_check` lays both out as :class:`Chain` views so that a
caller can compare call ids per chain, the exact sequences and the trainable tokens. Where the builders differ by
design (Gym repeats a shared prefix in every root-to-leaf chain and quarantines retry siblings; a failed parent link
is a hard boundary for Gym where ours re-attaches to an earlier call the prompt provably extends; Gym never merges
across an unresolved request), the chains differ and the test of that case names the difference.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from nemo_polar.env.gym.compat import BuildOutput
from nemo_polar.env.gym.compat import gym_prefix_merging as prefix_merging
from nemo_polar.env.gym.tokens import export_rollout
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import BuilderConfig, BuildResult
from nemo_polar.reconstruct.builders import prefix_merging as polar_prefix_merging


class Chain(BaseModel):
    """One trace or Gym chain: its calls, and its whole token sequence with the loss mask (1 = sampled)."""

    call_ids: list[str]
    tokens: list[int]
    loss_mask: list[int]
    main: bool = False  # ours: the main chain's first segment; Gym's: the chain it would deliver (``chain_id`` main)

    @property
    def trainable(self) -> list[int]:
        return [t for t, m in zip(self.tokens, self.loss_mask, strict=True) if m]


class CrossCheck(BaseModel):
    polar: list[Chain]  # in trace order: main first
    gym: list[Chain]  # in Gym's order: its main chain first
    gym_quarantined: list[str]
    gym_unresolved_parent_calls: list[str]
    gym_unresolved_retries: list[str]
    gym_empty_generation_calls: list[str]
    gym_parent_link_failures: dict[str, int]
    failed_calls: list[str]  # ours: listed; Gym: the rollout's incomplete marks

    @property
    def polar_chains(self) -> list[list[str]]:
        return [c.call_ids for c in self.polar]

    @property
    def gym_chains(self) -> list[list[str]]:
        return [c.call_ids for c in self.gym]

    @property
    def polar_main(self) -> list[str]:
        return next((c.call_ids for c in self.polar if c.main), [])

    @property
    def gym_main(self) -> list[str]:
        return next((c.call_ids for c in self.gym if c.main), [])

    @property
    def same_chains(self) -> bool:
        """The same calls in the same order in every chain (chain order aside)."""
        return sorted(self.polar_chains) == sorted(self.gym_chains)

    @property
    def same_tokens(self) -> bool:
        """Every chain's exact sequence and loss mask agree too (so its trainable tokens do)."""
        key = lambda c: (c.call_ids, c.tokens, c.loss_mask)  # noqa: E731
        return sorted(map(key, self.polar)) == sorted(map(key, self.gym))

    @property
    def polar_trainable(self) -> int:
        return sum(len(c.trainable) for c in self.polar)

    @property
    def gym_trainable(self) -> int:
        return sum(len(c.trainable) for c in self.gym)


def polar_view(result: BuildResult) -> list[Chain]:
    main = next((t for t in result.traces if t.role == "main"), None)
    return [
        Chain(
            call_ids=t.call_ids,
            tokens=t.prompt_ids + t.response_ids,
            loss_mask=[0] * len(t.prompt_ids) + t.loss_mask,
            main=t is main,
        )
        for t in result.traces
    ]


def gym_view(out: BuildOutput) -> list[Chain]:
    chains = []
    for chain in out.chains:
        tokens, mask = list(chain.root_prompt), [0] * len(chain.root_prompt)
        for link in chain.links:
            generated = link.entry.generation_token_ids
            tokens += [*link.interstitial, *generated]
            mask += [0] * len(link.interstitial) + [1] * len(generated)
        call_ids = [link.entry.model_call_id for link in chain.links]
        chains.append(Chain(call_ids=call_ids, tokens=tokens, loss_mask=mask, main=chain.chain_id == "main"))
    return chains


def cross_check(records: Iterable[CallRecord], cfg: BuilderConfig | None = None, rollout_id: str = "") -> CrossCheck:
    """Both builders over one rollout's records (one session's, as :func:`~nemo_polar.reconstruct.io.load_records`
    groups them)."""
    records = list(records)
    ours = polar_prefix_merging(records, cfg)
    export = export_rollout(records, rollout_id or (records[0].session_id if records else "empty"))
    theirs = prefix_merging(export.entries)
    return CrossCheck(
        polar=polar_view(ours),
        gym=gym_view(theirs),
        gym_quarantined=theirs.quarantined,
        gym_unresolved_parent_calls=theirs.notes.unresolved_parent_calls,
        gym_unresolved_retries=theirs.notes.unresolved_retries,
        gym_empty_generation_calls=theirs.notes.empty_generation_calls,
        gym_parent_link_failures=theirs.notes.parent_link_failures,
        failed_calls=[*(r.model_call_id for r in export.refused), *export.incomplete_call_ids],
    )
