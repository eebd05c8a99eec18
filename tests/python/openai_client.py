"""Drives `ember serve` with the official `openai` Python client; prints one JSON object of what it got.

Run by tests/serve_cli.rs (which compares the results with `ember generate`), not by hand:
    python tests/python/openai_client.py BASE_URL API_KEY MODEL
"""

import json
import sys

import openai


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    out = {"models": [m.id for m in client.models.list().data]}
    messages = [{"role": "user", "content": "Hello"}]

    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    out["chat"] = {
        "content": chat.choices[0].message.content,
        "finish_reason": chat.choices[0].finish_reason,
        "completion_tokens": chat.usage.completion_tokens,
    }

    pieces, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    out["stream"] = {"content": "".join(pieces), "finish_reason": finish, "completion_tokens": usage}

    completion = client.completions.create(model=model, prompt="Once upon", max_tokens=4, temperature=0)
    out["completion"] = {"text": completion.choices[0].text, "finish_reason": completion.choices[0].finish_reason}

    try:
        client.chat.completions.create(model=model, messages=messages, temperature=5)
        out["bad_temperature"] = None
    except openai.BadRequestError as e:
        out["bad_temperature"] = {"status": e.status_code, "param": e.body.get("param") if isinstance(e.body, dict) else None}

    try:
        openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        out["wrong_key"] = None
    except openai.AuthenticationError as e:
        out["wrong_key"] = {"status": e.status_code}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
