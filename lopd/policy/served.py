"""A student as an MLflow pyfunc model: the plain Hugging Face checkpoint is the model's artifact.

Why pyfunc and not MLflow's ``transformers`` flavor: on this offline CPU install the transformers
flavor fails to log the embedded tiny Qwen3 (it asks the Hub for a model card and builds a
``pipeline`` that imports torchvision, which the project does not install; tried with MLflow 3.17).
The pyfunc model keeps the exact directory ``lopd distill`` exported (weights, tokenizer, chat
template, model card) under ``artifacts/checkpoint``, so a registered version loads back as the
same checkpoint: ``load_policy`` on the downloaded directory, or ``mlflow.pyfunc.load_model`` and
:meth:`PolicyModel.policy`.

``predict`` plays one turn: each input row's ``messages`` (the chat so far as JSON: a list of
``{"role", "content"}``) gives the next assistant action, sampled at ``temperature`` / ``top_p``
(params, in :func:`signature`; greedy when ``temperature`` is 0) with ``seed``.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc

CHECKPOINT = "checkpoint"  # the artifact key (and folder under the model's artifacts/)


def signature():
    """The pyfunc signature: a ``messages`` JSON column in, one action string out; generation params with defaults."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string", "messages")]), outputs=Schema([ColSpec("string")]),
                          params=ParamSchema([ParamSpec("max_new_tokens", "long", 64), ParamSpec("temperature", "double", 0.0),
                                              ParamSpec("top_p", "double", 1.0), ParamSpec("seed", "long", 0)]))


class PolicyModel(mlflow.pyfunc.PythonModel):
    """The checkpoint as a pyfunc model (module docstring)."""

    def load_context(self, context) -> None:
        from lopd.policy.modeling import load_policy

        self.path = Path(context.artifacts[CHECKPOINT])
        self.model, self.tokenizer = load_policy(self.path)

    def policy(self):
        """(model, tokenizer): the same objects ``load_policy`` gives for the checkpoint directory."""
        return self.model, self.tokenizer

    def predict(self, context, model_input, params: dict | None = None) -> list[str]:
        import torch

        from lopd.policy.chat import encode, render_prompt

        params = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "seed": 0, **(params or {})}
        rows = list(model_input["messages"])
        torch.manual_seed(int(params["seed"]))
        out = []
        for messages in rows:
            messages = json.loads(messages) if isinstance(messages, str) else list(messages)
            ids = torch.tensor([encode(self.tokenizer, render_prompt(self.tokenizer, messages))], device=self.model.device)
            sample = float(params["temperature"]) > 0
            gen = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(params["max_new_tokens"]),
                                      do_sample=sample, temperature=float(params["temperature"]) if sample else None,
                                      top_p=float(params["top_p"]) if sample else None, pad_token_id=self.tokenizer.pad_token_id,
                                      eos_token_id=self.tokenizer.eos_token_id)
            out.append(self.tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
        return out
