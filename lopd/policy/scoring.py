"""Log-probs of target tokens, in the layout every loss in ``lopd.train.losses`` expects.

Layout: tensors are indexed by *target* position. ``logp_BTV[b, t]`` is the model's
distribution over token ``t`` of row ``b`` given tokens ``< t``; positions off the mask hold
zeros. Only masked positions go through the LM head (as ``lm_train.masked_nll`` does): with a
150k vocabulary the head, not the decoder, is what a full ``model(...).logits`` makes costly.
"""

from __future__ import annotations

from peft import PeftModel
from torch import Tensor


def base_model(model):
    """The underlying ``*ForCausalLM`` of a peft-wrapped or plain model."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def target_logprobs(
    model,
    target_mask_BT: Tensor,
    attention_mask_BT: Tensor,
    *,
    input_ids_BT: Tensor | None = None,
    inputs_embeds_BTD: Tensor | None = None,
) -> Tensor:
    """Full-vocabulary log-softmax ``(N, V)`` (float32) at the N masked targets, in row-major order.

    Exactly one of ``input_ids_BT`` / ``inputs_embeds_BTD``. Position 0 has no context and
    cannot be a target. Adapters are used as the model currently has them (on or off).
    """
    mask_BT = target_mask_BT.bool()
    if mask_BT[:, 0].any():
        raise ValueError("position 0 cannot be a target (nothing precedes it); the prompt comes first")
    lm = base_model(model)
    h_BTD = lm.get_decoder()(
        input_ids=input_ids_BT, inputs_embeds=inputs_embeds_BTD, attention_mask=attention_mask_BT
    ).last_hidden_state
    # The hidden state at t−1 predicts token t.
    logits_NV = lm.get_output_embeddings()(h_BTD[:, :-1][mask_BT[:, 1:]])
    return logits_NV.float().log_softmax(-1)


def scatter_targets(values_N: Tensor, mask_BT: Tensor) -> Tensor:
    """Place row-major per-target values ``(N, ...)`` into ``(B, T, ...)`` at ``mask_BT``; zeros elsewhere.

    Differentiable in ``values_N`` (an index_put), so gradients flow back to whatever produced them.
    """
    mask_BT = mask_BT.bool()
    out = values_N.new_zeros(*mask_BT.shape, *values_N.shape[1:])
    out[mask_BT] = values_N
    return out


def token_logprobs(model, ids_BT: Tensor, attn_BT: Tensor, mask_BT: Tensor) -> tuple[Tensor, Tensor]:
    """A policy's ``(logp_BTV, token_logp_BT)`` at the masked tokens of ``ids_BT`` (e.g. the student's actions).

    ``token_logp_BT[b, t] = log π(ids[b, t] | ids[b, :t])``. Full vocabulary: fine for the tiny
    model; a 150k-vocabulary batch should be chunked by the caller.
    """
    logp_NV = target_logprobs(model, mask_BT, attn_BT, input_ids_BT=ids_BT)
    tok_N = logp_NV.gather(-1, ids_BT[mask_BT.bool()].unsqueeze(-1)).squeeze(-1)
    return scatter_targets(logp_NV, mask_BT), scatter_targets(tok_N, mask_BT)
