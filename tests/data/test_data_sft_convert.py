"""SFT converters: each public format to our messages format; bad rows reported, not lost."""
from __future__ import annotations

import json

import pytest

from rstar2_cli.data.problems import DataError
from rstar2_cli.data.sft_convert import RowError, convert_file, convert_row

WEATHER_TOOL = {"name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_openai_messages():
    row = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "It is 21C."},
        ],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
    }
    rec = convert_row(row, "openai")
    assert rec["messages"][1] == {"role": "assistant", "content": "",
                                  "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert rec["messages"][2] == {"role": "tool", "content": "{\"temp\": 21}"}
    assert rec["tools"] == [WEATHER_TOOL]


def test_sharegpt_with_function_call_and_observation():
    row = {"system": "Be brief.", "tools": json.dumps([WEATHER_TOOL]), "conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
        {"from": "observation", "value": "{\"temp\": 3}"},
        {"from": "gpt", "value": "3C."}]}
    rec = convert_row(row, "sharegpt")
    assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert rec["messages"][2]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert rec["tools"] == [WEATHER_TOOL]


def test_apigen_mt_thought_then_call_merge_into_one_assistant_turn():
    row = {"tools": json.dumps([WEATHER_TOOL]), "system": "You are an airline agent.", "conversations": [
        {"from": "human", "value": "Cancel my booking ABC."},
        {"from": "gpt", "value": "Let me look it up."},
        {"from": "function_call", "value": "{\"name\": \"get_reservation\", \"arguments\": {\"id\": \"ABC\"}}"},
        {"from": "observation", "value": "{\"status\": \"active\"}"},
        {"from": "gpt", "value": "Cancelled."}]}
    msgs = convert_row(row, "apigen_mt")["messages"]
    assert msgs[2] == {"role": "assistant", "content": "Let me look it up.",
                       "tool_calls": [{"name": "get_reservation", "arguments": {"id": "ABC"}}]}
    assert len(msgs) == 5


def test_glaive_function_calling_v2():
    row = {"system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
                     "required -\n" + json.dumps(WEATHER_TOOL, indent=4),
           "chat": "USER: What's the weather in Rome?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\", "
                   "\"arguments\": '{\"city\": \"Rome\"}'} <|endoftext|>\n\n\nFUNCTION RESPONSE: {\"temp\": 30}"
                   "\n\n\nASSISTANT: It is 30 degrees in Rome. <|endoftext|>\n"}
    rec = convert_row(row, "glaive")
    assert rec["messages"][0] == {"role": "system", "content": "You are a helpful assistant with access to the "
                                                               "following functions. Use them if required"}
    assert rec["messages"][2]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert rec["messages"][3] == {"role": "tool", "content": "{\"temp\": 30}"}
    assert rec["messages"][4] == {"role": "assistant", "content": "It is 30 degrees in Rome."}
    assert rec["tools"] == [WEATHER_TOOL]


def test_toolace_python_style_calls():
    system = ("You are an expert in composing functions. Here is a list of functions in JSON format that you "
              "can invoke:\n" + json.dumps([WEATHER_TOOL]) + ". Should you decide to call, put it in [func(a=1)].")
    row = {"system": system, "conversations": [
        {"from": "user", "value": "Weather in Lima and Quito?"},
        {"from": "assistant", "value": "[get_weather(city=\"Lima\"), get_weather(city='Quito')]"},
        {"from": "tool", "value": "[{\"name\": \"get_weather\", \"results\": {\"temp\": 18}}]"},
        {"from": "assistant", "value": "Lima 18C."}]}
    rec = convert_row(row, "toolace")
    assert rec["messages"][2]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Lima"}},
                                                {"name": "get_weather", "arguments": {"city": "Quito"}}]
    assert rec["messages"][4] == {"role": "assistant", "content": "Lima 18C."}
    assert rec["tools"] == [WEATHER_TOOL]


def test_convert_file_reports_bad_rows_with_line_numbers(tmp_path):
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    rows = [json.dumps(good), "{not json", json.dumps({"conversations": [{"from": "alien", "value": "x"}]}),
            json.dumps({"conversations": [{"from": "human", "value": "only a question"}]}),
            json.dumps({"conversations": [{"from": "function_call", "value": "{bad"}, {"from": "gpt", "value": "x"}]}),
            json.dumps(good)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(rows) + "\n")
    stats = convert_file(src, tmp_path / "out.jsonl", "sharegpt")
    assert (stats.rows, stats.converted, stats.skipped) == (6, 2, 4)
    assert [e.split(": ", 1)[0] for e in stats.errors] == [f"{src}:{n}" for n in (2, 3, 4, 5)]
    assert "unknown speaker 'alien'" in stats.errors[1] and "no assistant message" in stats.errors[2]
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out == [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 2


def test_unknown_format_and_bad_arguments():
    with pytest.raises(DataError, match="unknown SFT format 'xml'"):
        convert_row({}, "xml")
    bad_args = {"messages": [{"role": "assistant", "content": "",
                              "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}
    with pytest.raises(RowError, match="arguments are not valid JSON"):
        convert_row(bad_args, "openai")


def test_convert_file_that_converts_nothing_writes_nothing(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "1", "problem": "p", "answer": "1"}) + "\n{not json\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError) as err:
        convert_file(src, out, "openai")
    assert str(err.value).startswith(f"{src}: 0 of 2 rows convert as --format openai (line 1: ")
    assert not out.exists()
    src.write_text("\n")
    with pytest.raises(DataError, match=r"in.jsonl: no rows"):
        convert_file(src, out, "openai")
    assert list(tmp_path.iterdir()) == [src]


def test_convert_file_that_fails_midway_keeps_the_previous_output(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    src = tmp_path / "in.jsonl"
    src.write_bytes((json.dumps(good) + "\n").encode() * 2000 + b'{"x": "\xff"}\n')   # past the 64 KiB head
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    with pytest.raises(DataError, match=r"in.jsonl:2001: not UTF-8 text"):
        convert_file(src, out, "openai")
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]
