"""``av-core profile --engine llama.cpp``, ``av-core bench-engine`` and ``av-core collect
--engine llama.cpp`` on the tiny GGUF pair: what they write, resuming, and their one-line
errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from av_core.llama_cpp.bench import README_END, README_START, aggregate, format_table, update_readme
from av_core.llama_cpp.profile import EngineCosts
from av_core.tools.cli import main
from av_core.tools.trace import read_trace

PROMPTS = [
    {
        "prompt_id": f"p{i}",
        "workload": "code" if i % 2 else "prose",
        "prompt": f"def f{i}(x): return x + {i}",
        "chat": False,
    }
    for i in range(6)
]


@pytest.fixture
def prompts_file(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def _models(pair: tuple[str, str]) -> list[str]:
    return ["--target", pair[0], "--drafter", pair[1]]


def test_profile_writes_the_loops_cost_tables(tmp_path, tiny_pair, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "costs.json"
    argv = ["profile", "--engine", "llama.cpp", *_models(tiny_pair), "--concurrency", "1,3"]
    assert main([*argv, "--k", "3", "--context", "24", "--repeats", "1", "--output", str(out)]) == 0
    costs = EngineCosts.load(out)
    assert sorted(costs.points) == [1, 3] and costs.num_positions == 3
    # Verification shapes: R requests x (1 + a) tokens for a = 0..K; drafter passes 1..R.
    assert [t for t, _ in costs.points[3]["verify"]] == [3, 6, 9, 12]
    assert [n for n, _ in costs.points[3]["draft"]] == [1, 2, 3]
    assert [d for d, _ in costs.points[3]["draft_depth"]] == [0, 1, 2, 3]
    tables = costs.tables(3)
    assert tables.max_draft_depth == 3 and len(tables.verify_ms) == 3 * 4 + 1
    assert "R=3: verify 3 tok" in capsys.readouterr().out


def test_bench_engine_runs_resumes_and_fills_the_readme(
    tmp_path, tiny_pair, prompts_file, capsys
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bench"
    argv = [
        "bench-engine", *_models(tiny_pair), "--prompts", str(prompts_file), "--out", str(out),
        "--concurrency", "1,2", "--threads", "1", "--repeats", "2", "--max-new-tokens", "12",
        "--policies", "no-spec,K=2,llama.cpp-p0.75,AV+D", "--k", "2", "--profile-repeats", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    runs = (out / "runs.jsonl").read_text().splitlines()
    # R x repeats x policies: K=2 and llama.cpp (defaults) are the trace runs.
    assert len(runs) == 2 * 2 * 5
    data = json.loads((out / "results.json").read_text())
    rows = {(r["policy"], r["R"]): r for r in data["rows"]}
    assert len(rows) == 10
    for row in data["rows"]:
        assert row["repeats"] == 2 and row["threads"] == 1
        assert row["spread"][0] <= row["tokens_per_s"] <= row["spread"][1]
        assert row["tokens_per_s"] > 0 and row["tokens_per_s_cpu"] > 0
    assert rows[("no-spec", 1)]["tokens_per_verification"] == 1.0
    assert all(row["simulated_tokens_per_s"] > 0 for row in rows.values())
    # A policy that does not read verdicts, replayed on its own run's trace (or, no-spec, on
    # any), makes the run's steps: its prediction is the run's own steps priced.
    for name in ("K=2", "llama.cpp", "no-spec"):
        for r in (1, 2):
            row = rows[(name, r)]
            assert row["simulated_tokens_per_s"] == pytest.approx(row["priced_tokens_per_s"])
    assert sorted(p.name for p in (out / "traces").iterdir()) == sorted(
        f"t1_R{r}_r{i}_{name}.csv.gz"
        for r in (1, 2)
        for i in (0, 1)
        for name in ("K=2", "llama.cpp")
    )
    assert "| 1 | 2 | AV+D |" in capsys.readouterr().out
    # A second run finds every run done and adds none.
    assert main(argv) == 0
    assert (out / "runs.jsonl").read_text().splitlines() == runs
    # Other settings into the same folder would mix runs: refused, nothing changed.
    capsys.readouterr()
    assert main([*argv[:-4], "--max-new-tokens", "16", *argv[-4:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a benchmark of other settings: max_new_tokens 12" in err[0]
    assert (out / "runs.jsonl").read_text().splitlines() == runs
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nold\n{README_END}\ntail\n")
    assert main(["bench-engine", "--out", str(out), "--update-readme", str(readme)]) == 0
    text = readme.read_text()
    assert (
        "old" not in text
        and "| 1 | 1 | no-spec |" in text
        and text.endswith(f"{README_END}\ntail\n")
    )


def test_collect_writes_a_full_verification_trace_and_resumes(
    tmp_path, tiny_pair, prompts_file, capsys
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "trace.csv.gz"
    argv = ["collect", "--engine", "llama.cpp", *_models(tiny_pair), "--prompts", str(prompts_file)]
    argv += ["--output", str(out), "--max-new-tokens", "16", "--k", "3", "--max-prompts", "4"]
    assert main(argv) == 0
    trace = read_trace(out)
    assert sorted(set(trace.prompt_id.tolist())) == ["p0", "p1", "p2", "p3"]
    assert trace.admitted.all() and trace.num_positions == 3
    assert "4 prompts collected, 0 already present" in capsys.readouterr().out
    assert main([*argv[:-2], "--max-prompts", "6"]) == 0
    assert "2 prompts collected, 4 already present" in capsys.readouterr().out
    assert len(read_trace(out)) > len(trace)


#: A llama.cpp profile and collection of the tiny pair, as the error cases below format them.
PROFILE = ["profile", "--engine", "llama.cpp", "--target", "{t}", "--drafter", "{d}"]
PROFILE += ["--output", "{out}"]
COLLECT = ["collect", "--engine", "llama.cpp", "--target", "{t}", "--drafter", "{d}"]
COLLECT += ["--prompts", "{prompts}", "--output", "{csv}"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench-engine", "--target", "{t}", "--drafter", "{missing}"],
            "no such model directory or .gguf file",
        ),
        (
            ["bench-engine", "--target", "{t}", "--drafter", "{d}", "--policies", "K=2,fast"],
            "unknown policy 'fast'",
        ),
        (["bench-engine", "--target", "{t}"], "--target and --drafter are required"),
        (
            ["profile", "--engine", "llama.cpp", "--target", "{t}", "--output", "{out}"],
            "--drafter is required with --engine llama.cpp",
        ),
        (
            [
                "profile",
                "--engine",
                "llama.cpp",
                "--target",
                "{dir}",
                "--drafter",
                "{d}",
                "--output",
                "{out}",
            ],
            "reads a .gguf file, not a directory",
        ),
        (
            [
                "collect",
                "--engine",
                "llama.cpp",
                "--target",
                "{t}",
                "--drafter",
                "{text}",
                "--prompts",
                "{prompts}",
                "--output",
                "{csv}",
            ],
            "not a GGUF file",
        ),
        (["bench-engine", "--out", "{dir}", "--update-readme", "{text}"], "results.json"),
        # Options only the transformers path reads are refused, not ignored.
        ([*PROFILE, "--device", "cuda"], "--device 'cuda': only --engine transformers reads it"),
        ([*PROFILE, "--tokens", "1,2"], "--tokens '1,2': only --engine transformers reads it"),
        ([*PROFILE, "--draft-depths", ""], "--draft-depths '': only --engine transformers"),
        ([*COLLECT, "--device", "cuda:0"], "--device 'cuda:0': only --engine transformers"),
    ],
)
def test_errors_are_one_line_with_exit_2(
    argv, message, tmp_path, tiny_pair, prompts_file, capsys
) -> None:  # type: ignore[no-untyped-def]
    text = tmp_path / "model.gguf"
    text.write_text("hello")
    values = {
        "t": tiny_pair[0], "d": tiny_pair[1], "missing": str(tmp_path / "absent.gguf"),
        "out": str(tmp_path / "c.json"), "dir": str(tmp_path), "text": str(text),
        "prompts": str(prompts_file), "csv": str(tmp_path / "t.csv"),
    }  # fmt: skip
    assert main([a.format(**values) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"av-core {argv[0]}: error: ")
    assert message.format(**values) in err[0]
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "t.csv").exists()


def test_aggregate_and_table_on_hand_records() -> None:
    base = {"R": 2, "threads": 1, "accepted": 3, "admitted": 4, "tokens": 10, "target_calls": 5,
            "verifications": 10, "depth0_steps": 1, "host_ms_per_step": 0.1,
            "tokens_per_s_cpu": 1.0,
            "priced_tokens_per_s": 2.0, "simulated_tokens_per_s": None}  # fmt: skip
    records = [
        {**base, "policy": "AV+D", "repeat": i, "tokens_per_s": v}
        for i, v in enumerate([3.0, 1.0, 2.0])
    ] + [{**base, "policy": "no-spec", "repeat": 0, "tokens_per_s": 4.0}]
    rows = {r["policy"]: r for r in aggregate(records)}
    assert rows["AV+D"]["tokens_per_s"] == 2.0 and rows["AV+D"]["spread"] == [1.0, 3.0]
    assert rows["AV+D"]["acceptance"] == 0.75 and rows["AV+D"]["repeats"] == 3
    assert rows["AV+D"]["tokens_per_target_call"] == 2.0
    table = format_table({"rows": list(rows.values())})
    assert "| 1 | 2 | AV+D | 2.00 | 1.00–3.00 |" in table and table.rstrip().endswith("| 1.000 |")
    assert "| 0.500 |" in table  # AV+D against the best (no-spec) at R = 2
    # By CPU time, the CPU figures decide (equal here): every ratio is 1.
    table = format_table({"rows": list(rows.values()), "clock": "cpu"})
    assert "| 0.500 |" not in table and table.count("| 1.000 |") == 2


def test_update_readme_without_markers_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rows": []}))
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert update_readme(readme, results) is False
    assert readme.read_text() == "no markers\n"


def test_profile_opens_contexts_that_hold_its_own_shapes(tmp_path, tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """The profile feeds each sequence --context tokens, then up to 33 catch-up tokens and a draft
    block. At --context 220 and K = 4 a context sized for the context and one draft block gets
    256 cells per sequence (llama.cpp's padding) where the profile needs 262: the command must
    open contexts that hold its own shapes (it has no option to raise n_ctx)."""
    out = tmp_path / "costs.json"
    argv = ["profile", "--engine", "llama.cpp", *_models(tiny_pair), "--concurrency", "1"]
    argv += ["--k", "4", "--context", "220", "--repeats", "1", "--output", str(out)]
    assert main(argv) == 0
    costs = EngineCosts.load(out)
    assert costs.num_positions == 4 and [t for t, _ in costs.points[1]["verify"]] == [1, 2, 3, 4, 5]


def test_bench_engine_profiles_long_prompts(tmp_path, tiny_pair, capsys) -> None:  # type: ignore[no-untyped-def]
    """Prompts near --max-prompt-tokens: the profile runs at their mean length plus half the new
    tokens, which with K = 4, 10 new tokens and prompts of about 230 tokens needs more than
    the 256 cells a context sized for the runs alone gives each sequence."""
    prompts = tmp_path / "long.jsonl"
    prompt = {"prompt_id": "long", "workload": "code", "prompt": "x" * 228, "chat": False}
    prompts.write_text(json.dumps(prompt) + "\n")
    out = tmp_path / "bench"
    argv = ["bench-engine", *_models(tiny_pair), "--prompts", str(prompts), "--out", str(out)]
    argv += ["--concurrency", "1", "--threads", "1", "--repeats", "1", "--max-new-tokens", "10"]
    argv += ["--max-prompt-tokens", "240", "--policies", "no-spec", "--profile-repeats", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2  # no-spec and the K=4 trace


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--drafter", "{text}"], "not a GGUF file"),
        (["--drafter", "{d}", "--max-prompt-tokens", "2"], "prompts fit --max-prompt-tokens 2"),
    ],
)
def test_a_refused_benchmark_leaves_nothing_behind(
    option, message, tmp_path, tiny_pair, prompts_file, capsys
) -> None:  # type: ignore[no-untyped-def]
    """A benchmark refused after the options parse (a model llama.cpp cannot load, no prompt
    that fits) writes nothing: no --out folder, so no settings.json that would make the next
    benchmark into that folder, with other settings, be refused as a mix."""
    text = tmp_path / "model.gguf"
    text.write_text("hello")
    out = tmp_path / "bench"
    argv = ["bench-engine", "--target", tiny_pair[0], "--prompts", str(prompts_file)]
    argv += ["--out", str(out), "--concurrency", "1", "--threads", "1", "--repeats", "1"]
    argv += ["--policies", "no-spec", "--profile-repeats", "1", "--max-new-tokens", "4"]
    values = {"text": str(text), "d": tiny_pair[1]}
    assert main([*argv, *(a.format(**values) for a in option)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()
    argv[argv.index("--max-new-tokens") + 1] = "6"
    assert main([*argv, "--drafter", tiny_pair[1]]) == 0, capsys.readouterr().err


def test_a_sampling_policy_deeper_than_k_is_refused(
    tmp_path, tiny_pair, prompts_file, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Fixed K = 4 under --k 2: its prediction would replay the K = 2 trace, whose rounds hold two
    drafts, and so predict a policy of depth 2. Refused before anything runs or is written;
    llama.cpp's policy (n_max = 3, its own greedy trace) is not refused at --k 2."""
    out = tmp_path / "bench"
    argv = ["bench-engine", *_models(tiny_pair), "--prompts", str(prompts_file), "--out", str(out)]
    argv += ["--concurrency", "1", "--threads", "1", "--repeats", "1", "--max-new-tokens", "4"]
    argv += ["--k", "2", "--profile-repeats", "1", "--policies"]
    assert main([*argv, "no-spec,K=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "K=4 drafts 4 positions, more than --k 2" in err[0]
    assert not out.exists()
    assert main([*argv, "no-spec,llama.cpp"]) == 0, capsys.readouterr().err
