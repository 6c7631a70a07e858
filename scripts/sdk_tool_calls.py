"""What the OpenAI Python SDK makes of this server's tool calls: for a named and a required
tool_choice, whole and streamed, the SDK's own objects (the stream assembled the way its
`ChatCompletionStreamState` does) must hold calls to the function whose arguments parse and
carry the required keys. Usage: sdk_tool_calls.py BASE_URL MODEL. Exits non-zero on a failure."""

import json
import sys

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}]
messages = [{"role": "user", "content": "Weather in Oslo?"}]
choices = [{"type": "function", "function": {"name": "get_weather"}}, "required"]


def check(calls, how):
    assert calls, f"{how}: no tool calls"
    for call in calls:
        assert call.function.name == "get_weather", f"{how}: {call.function.name}"
        args = json.loads(call.function.arguments)
        assert isinstance(args["city"], str) and args["unit"] in ("c", "f"), f"{how}: {args}"


for choice in choices:
    reply = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                           tool_choice=choice, max_tokens=200)
    check(reply.choices[0].message.tool_calls, f"{choice} whole")
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                tool_choice=choice, max_tokens=200, stream=True):
        state.handle_chunk(chunk)
    streamed = state.get_final_completion()
    check(streamed.choices[0].message.tool_calls, f"{choice} streamed")
print("ok")
