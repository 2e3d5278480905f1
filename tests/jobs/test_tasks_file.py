"""Tasks files (JSONL, YAML, JSON) and the Hugging Face loader: good files load, bad ones name the
line or item, the shipped examples are valid jobs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from polar_mq.jobs.hf_tasks import load_hf_tasks
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.task_errors import TasksFileError
from polar_mq.jobs.tasks_file import load_job_file

if TYPE_CHECKING:  # `datasets` (and pandas) load only where a test uses them: every xdist worker
    import datasets  # collects this file

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_one_task_per_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "t.jsonl",
        '{"instruction": "a", "answer": 1}\n\n# a comment\n'
        '{"instruction": "b", "metadata": {"k": 2}, "tests": ["x"]}\n',
    )
    loaded = load_job_file(path)
    assert loaded.job == {}
    assert loaded.tasks == [
        {"instruction": "a", "answer": 1},
        {"instruction": "b", "metadata": {"k": 2}, "tests": ["x"]},
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"instruction": "a"}\n{"instruction": "b"\n', "t.jsonl line 2: not valid JSON"),
        ('{"instruction": "a"}\n\n{"answer": "1"}\n', "t.jsonl line 3: 'instruction' must be"),
        ('{"instruction": "  "}\n', "line 1: 'instruction' must be a non-empty string"),
        ('{"instruction": "a", "answer": {"x": 1}}\n', "line 1: 'answer' must be a string"),
        ('{"instruction": "a", "answer": true}\n', "line 1: 'answer' must be"),
        ('{"instruction": "a", "metadata": [1]}\n', "line 1: 'metadata' must be a mapping"),
        ('["instruction"]\n', "line 1: a task must be a mapping, got list"),
        ("\n# only a comment\n", "t.jsonl: no tasks"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TasksFileError) as error:
        load_job_file(_write(tmp_path, "t.jsonl", text))
    assert message in str(error.value)


def test_yaml_list_and_mapping_with_job_fields(tmp_path: Path) -> None:
    listed = load_job_file(_write(tmp_path, "a.yaml", "- instruction: hi\n  answer: [x, 2]\n"))
    assert (listed.tasks, listed.job) == ([{"instruction": "hi", "answer": ["x", 2]}], {})
    mapping = load_job_file(
        _write(
            tmp_path,
            "b.yml",
            "samples_per_task: 8\nevaluator: {name: regex, pattern: ok}\n"
            "tasks:\n  - instruction: one\n  - {instruction: two, metadata: {level: 1}}\n",
        )
    )
    assert mapping.job == {"samples_per_task": 8, "evaluator": {"name": "regex", "pattern": "ok"}}
    assert [t["instruction"] for t in mapping.tasks] == ["one", "two"]
    assert mapping.spec()["tasks"] == mapping.tasks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tasks:\n  - instruction: a\n  - answer: 2\n", "t.yaml line 3 (tasks[1]): 'instruction'"),
        ("- instruction: a\n- instruction: b\n- 7\n", "t.yaml line 3 (tasks[2]): a task must be"),
        ("samples_per_task: 2\n", "a mapping needs a 'tasks' list"),
        ("tasks: []\n", "'tasks' must be a non-empty list"),
        ("just text\n", "must hold a list of tasks or a mapping"),
        ("tasks: [instruction: a\n", "is not valid YAML"),
    ],
)
def test_yaml_errors_name_the_line_and_item(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TasksFileError) as error:
        load_job_file(_write(tmp_path, "t.yaml", text))
    assert message in str(error.value)


def test_json_job_or_task_list_and_unknown_suffix(tmp_path: Path) -> None:
    job = load_job_file(_write(tmp_path, "j.json", '{"tasks": [{"instruction": "x"}], "a": 1}'))
    assert (job.tasks, job.job) == ([{"instruction": "x"}], {"a": 1})
    tasks = load_job_file(_write(tmp_path, "l.json", '[{"instruction": "y"}]'))
    assert tasks.tasks == [{"instruction": "y"}]
    with pytest.raises(TasksFileError, match=r"j2.json tasks\[1\]: 'instruction'"):
        load_job_file(_write(tmp_path, "j2.json", '{"tasks": [{"instruction": "x"}, {}]}'))
    with pytest.raises(TasksFileError, match="not valid JSON"):
        load_job_file(_write(tmp_path, "bad.json", "{nope"))
    with pytest.raises(TasksFileError, match=r"unknown file type \.txt"):
        load_job_file(_write(tmp_path, "t.txt", "x"))
    with pytest.raises(TasksFileError, match="cannot read"):
        load_job_file(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "name", ["tasks/math_small.jsonl", "tasks/text_small.yaml", "arithmetic.json"]
)
def test_shipped_examples_are_valid_jobs(name: str) -> None:
    loaded = load_job_file(REPO / "examples" / name)
    assert all(t["instruction"].strip() and "answer" in t for t in loaded.tasks)
    job = JobCreate.model_validate({"evaluator": "exact_match", **loaded.spec()})
    assert len(job.tasks) == len(loaded.tasks)
    if name.endswith(".jsonl"):
        assert len(loaded.tasks) == 20


def _dataset() -> datasets.Dataset:
    import datasets

    return datasets.Dataset.from_dict(
        {
            "question": [f"What is {i} + {i}?" for i in range(5)],
            "answer": [f"work... #### {2 * i}" for i in range(5)],
            "level": [i % 2 for i in range(5)],
        }
    )


def test_hf_tasks_from_an_in_memory_dataset() -> None:
    tasks = load_hf_tasks(
        _dataset(),
        limit=3,
        metadata_fields=("level",),
        answer_transform=lambda text: text.split("####")[-1].strip(),
    )
    assert tasks == [
        {
            "instruction": f"What is {i} + {i}?",
            "answer": str(2 * i),
            "metadata": {"split": "train", "row": i, "level": i % 2},
        }
        for i in range(3)
    ]
    plain = load_hf_tasks(_dataset(), answer_field=None)
    assert len(plain) == 5 and "answer" not in plain[0]


def test_hf_tasks_from_disk_and_splits(tmp_path: Path) -> None:
    import datasets

    splits = datasets.DatasetDict({"train": _dataset(), "test": _dataset().select(range(2))})
    splits.save_to_disk(str(tmp_path / "saved"))
    from_disk = load_hf_tasks(tmp_path / "saved", split="test")
    assert [t["instruction"] for t in from_disk] == ["What is 0 + 0?", "What is 1 + 1?"]
    _dataset().to_json(str(tmp_path / "rows.jsonl"))
    assert len(load_hf_tasks(str(tmp_path / "rows.jsonl"))) == 5
    with pytest.raises(TasksFileError, match="no split 'dev'; splits: train, test"):
        load_hf_tasks(splits, split="dev")
    with pytest.raises(TasksFileError, match="no column 'prompt'; columns: answer, level, q"):
        load_hf_tasks(_dataset(), instruction_field="prompt")
    with pytest.raises(TasksFileError, match="limit must be at least 1"):
        load_hf_tasks(_dataset(), limit=0)
    empty_instruction = datasets.Dataset.from_dict({"question": [""], "answer": ["1"]})
    with pytest.raises(TasksFileError, match="dataset row 0: 'instruction'"):
        load_hf_tasks(empty_instruction)
