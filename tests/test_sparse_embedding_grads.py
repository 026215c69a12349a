"""GRPOUpdate's sparse gradient for a tied input embedding (torchrl_grpo.training.update.sparse_tied_embedding_grads): the
same gradients as the dense default, a dense gradient when the step ends, the module left as it was, and no effect
on untied or frozen (LoRA) embeddings."""
from __future__ import annotations

import contextlib

import torch

import torchrl_grpo.training.update as upm
from tests.test_shared_prefix_update import (
    _assert_grads_close,
    _batch,
    _model,
    _multi_turn_rows,
    _update_grads,
)


def _dense(monkeypatch):
    monkeypatch.setattr(upm, "sparse_tied_embedding_grads", lambda model: contextlib.nullcontext(lambda: None))


def test_sparse_tied_embedding_gradients_equal_dense(tiny_model_and_tokenizer, monkeypatch):
    tokens, am, rm = _multi_turn_rows(n=6)
    batch = _batch(tokens, am, rm)
    model = _model(tiny_model_and_tokenizer, gc=False, lora=False)
    emb = model.get_input_embeddings()
    assert emb.weight is model.get_output_embeddings().weight  # tied: the case this saving is for
    seen = []
    orig = emb.forward
    emb.forward = lambda x: (seen.append(emb.sparse), orig(x))[1]
    with monkeypatch.context() as m:
        _dense(m)
        ref, ref_out, _ = _update_grads(model, batch, "auto", micro_batch_size=2)
    assert seen and not any(seen)
    seen.clear()
    got, out, _ = _update_grads(model, batch, "auto", micro_batch_size=2)
    assert seen and all(seen)  # the forward passes ran with sparse gradients ...
    assert not emb.sparse  # ... and the module is restored
    assert not emb.weight.grad.is_sparse and not got["model.embed_tokens.weight"].is_sparse
    _assert_grads_close(got, ref)
    assert out["loss/total"] == ref_out["loss/total"]


def test_sparse_gradient_is_made_dense_before_clipping():
    """If the embedding's gradient is sparse (no LM-head contribution arrived first), densify() turns it dense, and
    leaving the context does too."""
    emb = torch.nn.Embedding(11, 4)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = emb, torch.nn.Linear(4, 11, bias=False)
            self.head.weight = emb.weight

        def get_input_embeddings(self):
            return self.emb

        def get_output_embeddings(self):
            return self.head

    model = Tied()
    with upm.sparse_tied_embedding_grads(model) as densify:
        assert emb.sparse
        emb(torch.tensor([[1, 2, 2]])).sum().backward()
        assert emb.weight.grad.is_sparse
        densify()
        assert not emb.weight.grad.is_sparse
        assert emb.weight.grad[2].tolist() == [2.0] * 4 and emb.weight.grad[0].abs().sum() == 0
        emb.weight.grad = None
        emb(torch.tensor([[3]])).sum().backward()
    assert not emb.sparse and not emb.weight.grad.is_sparse


def test_untied_or_frozen_embeddings_are_left_alone(tiny_model_and_tokenizer):
    untied = torch.nn.Module()
    untied.emb, untied.head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5)
    untied.get_input_embeddings = lambda: untied.emb
    untied.get_output_embeddings = lambda: untied.head
    with upm.sparse_tied_embedding_grads(untied):
        assert not untied.emb.sparse
    lora = _model(tiny_model_and_tokenizer, gc=False, lora=True)  # embedding frozen under LoRA
    with upm.sparse_tied_embedding_grads(lora):
        assert not lora.get_input_embeddings().sparse
    with upm.sparse_tied_embedding_grads(torch.nn.Linear(2, 2)):  # no embeddings at all
        pass
