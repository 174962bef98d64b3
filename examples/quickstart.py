"""av_core in a decode loop: estimate, plan, verify, observe (numpy only; run it as a script).

A toy drafter and target stand in for a serving engine, so the loop runs anywhere. The README's
"Use" section is this file's marked part, which runs on its own when pasted. In an engine the
features come from the drafter's logits (``av_core.features.draft_log_odds``, CPU or GPU) and
the verdicts from the target.
"""

# --- README "Use" begins
import numpy as np

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner

K, R = 4, 64  # draft positions per request, requests in the batch
rng = np.random.default_rng(0)


def toy_step() -> tuple[np.ndarray, np.ndarray]:
    """A toy drafter and target: x = logit(q_max) of each draft, and which drafts the target
    accepts (p = sigmoid(0.6 x + 0.4), unknown to the estimator)."""
    x = rng.normal(1.5, 2.0, size=(R, K)).astype(np.float32)
    accepts = rng.random((R, K)) < 1.0 / (1.0 + np.exp(-(0.6 * x + 0.4)))
    return x, accepts


# Profiled step costs, (size, ms): a drafter pass over n requests, a verify pass over t tokens.
draft_curve = [(1, 0.6), (256, 0.6), (512, 1.4)]
verify_curve = [(1, 6.0), (256, 6.0), (8192, 240.0)]
slots = np.arange(R)  # the request slot of each row
scheduled_drafts = np.full(R, K)  # drafts each request brought this step

estimator = AcceptanceEstimator(K)  # vLLM's cold start; rounds of 100 steps
tables = CostTables.from_curves(draft_curve, verify_curve, max_num_reqs=256, max_batch_tokens=8192)
planner = VerificationPlanner(tables, K)  # budget from the previous step (lossless)

for _ in range(500):  # decode steps
    x, accepts = toy_step()  # x: float32 [R, K], logit(q_max) of each draft
    p = estimator.predict(x)  # acceptance probabilities [R, K]
    plan = planner.plan(slots, p, scheduled_drafts, num_non_draft_tokens=R, num_sampling_requests=R)
    # The target verifies plan.admitted[r] drafts of request r and accepts the leading ones:
    leading = np.cumprod(accepts, axis=1).sum(axis=1)
    accepted = np.minimum(leading, plan.admitted)
    estimator.observe(x, plan.admitted, accepted, p)  # refits after calls 1, 2, 4, ... of a round

print(f"refits: {estimator.num_refits}; slope {estimator.slope:.3f} (true 0.6)")
# --- README "Use" ends

print(f"intercepts {np.round(estimator.intercepts, 2)} (true 0.4 each)")
print(
    f"last step: verified {plan.budget} of {R * K} drafts, "
    f"expected {plan.expected_accepted_tokens:.1f} tokens in {plan.predicted_cost_ms:.2f} ms"
)
