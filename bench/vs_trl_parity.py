"""The parity check of bench/vs_trl.py: one fixed batch through both trainers, same weights."""

from __future__ import annotations

import argparse
import tempfile

from vs_trl import (GROUP, SEED, agentrt_config, examples, exact_match_reward, matmul_dtypes,
                    trl_args, trl_dataset)


def run_parity(a: argparse.Namespace) -> dict:
    """Log-probs, advantages and loss of one fixed batch on both trainers, same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from agentrt.algos.rae import RAEState
    from agentrt.runtime.learner import Learner
    from agentrt.runtime.steps import advantages_from
    from agentrt.rewards import exact_match
    from agentrt.envs.tasks import encode_prompt
    from agentrt.core.types import Trajectory, Turn, collate

    cfg = agentrt_config(a.model_dir, a.tokens, 1, "unused", a.threads, "hf", a.set,
                         a.precision).policy
    torch.manual_seed(SEED)
    eng = Learner(cfg, seed=SEED)
    tok = eng.tokenizer
    exs = [ex for ex in examples(4, SEED + 7) for _ in range(GROUP)]
    prompts = [encode_prompt(tok, ex.prompt) for ex in exs]
    comps = eng.generate(prompts)
    responses = [list(c.response_ids) for c in comps]
    for i in range(0, len(exs), 3):  # some right answers, so the rewards vary within groups
        responses[i] = tok.encode(exs[i].answer, add_special_tokens=False) + [eng.eos_id]
    rewards = [exact_match("", tok.decode(r, skip_special_tokens=True), {"answer": ex.answer})
               for r, ex in zip(responses, exs)]
    trajs = [Trajectory([Turn(p, r, [0.0] * len(r), reward=rw)], group_id=str(i // GROUP))
             for i, (p, r, rw) in enumerate(zip(prompts, responses, rewards))]
    batch = collate(trajs, eng.pad_id)
    ours_dt = matmul_dtypes(eng.model, lambda: "update")
    ours_lp = eng.logprobs(batch)
    eng.prepare(batch)
    advantages_from(batch, eng.algo, eng.kl_coef, RAEState.for_algorithm(eng.algo))
    ours_adv = batch.advantages.max(-1).values + batch.advantages.min(-1).values  # per row
    step = eng.update(batch)  # its loss and gradient norm are taken before the step
    ours_loss, ours_grad = step["actor/loss"], step["actor/grad_norm"]
    # the gradient stays in .grad after the step (clipping scales it: compare directions)
    ours_dir = {k: p.grad.detach().clone() for k, p in eng.model.named_parameters()
                if p.grad is not None}

    def fixed_rollout(prompts_text, trainer):
        return {"prompt_ids": prompts, "completion_ids": responses,
                "logprobs": [[0.0] * len(r) for r in responses]}

    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype="float32")
    hf_tok = AutoTokenizer.from_pretrained(a.model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(model=model, reward_funcs=exact_match_reward,
                              processing_class=hf_tok, rollout_func=fixed_rollout,
                              args=trl_args(tmp, a.tokens, 1, False, a.precision),
                              train_dataset=trl_dataset(hf_tok, 64))
        trl_dt = matmul_dtypes(trainer.model, lambda: "update")
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # what train() sets before a step
        rows = [{"prompt": hf_tok.bos_token + ex.prompt, "answer": ex.answer} for ex in exs]
        inputs = trainer._generate_and_score_completions(rows)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        k = inputs["completion_ids"].shape[1]
        with torch.no_grad():
            trl_lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, k)
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        trl_loss = float(loss)
        trl_dir = {k: p.grad for k, p in trainer.model.named_parameters() if p.grad is not None}
        trl_grad = float(torch.cat([g.flatten() for g in trl_dir.values()]).norm())
        a_vec = torch.cat([ours_dir[k].flatten() for k in trl_dir])
        t_vec = torch.cat([g.flatten() for g in trl_dir.values()])
        direction = float((a_vec / a_vec.norm() - t_vec / t_vec.norm()).norm())
        trl_adv = inputs["advantages"].reshape(-1)
    # agentrt rows are right-padded prompt+response; TRL's completions start at column 0.
    ours = torch.cat([ours_lp[i, len(p):len(p) + len(r)] for i, (p, r) in
                      enumerate(zip(prompts, responses))])
    theirs = torch.cat([trl_lp[i, :len(r)] for i, r in enumerate(responses)])
    return {"logprobs": float((ours - theirs).abs().max()), "mean_logprob": float(ours.mean()),
            "advantages": float((ours_adv - trl_adv).abs().max()),
            "loss": abs(ours_loss - trl_loss), "loss_agentrt": ours_loss, "loss_trl": trl_loss,
            "grad_norm": abs(ours_grad - trl_grad) / max(trl_grad, 1e-12),
            "grad_direction": direction, "rewards": sum(rewards),
            "dtypes": {"agentrt": sorted(ours_dt["update"]), "TRL": sorted(trl_dt["update"])}}
