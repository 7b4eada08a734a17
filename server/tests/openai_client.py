"""OpenAI's own Python client against the server on PORT (server/tests/http.rs starts it
and compares what this prints with the model's own reply).

    python3 openai_client.py PORT

Prints one JSON object: the models listed, a greedy chat reply whole and streamed (with the
usage of each), a text completion, and the client's exceptions for requests the server
refuses (their class, status and message).
"""

import json
import sys

import openai

port = int(sys.argv[1])
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
out = {"models": [m.id for m in client.models.list()]}

messages = [{"role": "user", "content": "hi"}]
whole = client.chat.completions.create(model="chatml", messages=messages, max_tokens=6, temperature=0)
out["chat"] = whole.choices[0].message.content
out["chat_finish"] = whole.choices[0].finish_reason
out["chat_usage"] = whole.usage.model_dump()

pieces, finish, usage = [], None, None
for chunk in client.chat.completions.create(
    model="chatml", messages=messages, max_tokens=6, temperature=0, stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
out["streamed"] = "".join(pieces)
out["streamed_finish"] = finish
out["streamed_usage"] = usage

completion = client.completions.create(model="chatml", prompt="item 3:", max_tokens=5)
out["completion"] = completion.choices[0].text
out["completion_usage"] = completion.usage.model_dump()

errors = []
for what, call in [
    ("two choices", lambda: client.chat.completions.create(model="chatml", messages=messages, n=2)),
    ("unknown model", lambda: client.chat.completions.create(model="gpt-9", messages=messages)),
    ("max_tokens 0", lambda: client.completions.create(model="chatml", prompt="a", max_tokens=0)),
]:
    try:
        call()
        errors.append({"what": what, "raised": None})
    except openai.APIStatusError as e:
        errors.append({"what": what, "raised": type(e).__name__, "status": e.status_code,
                       "message": e.message})
out["errors"] = errors
print(json.dumps(out))
