"""Drive a running `minirun serve` with the official `openai` Python client.

Usage: python openai_chat_check.py BASE_URL MODEL PROMPT MAX_TOKENS

Lists the models; makes one chat completion and one streamed chat completion (greedy) and
checks that the stream's deltas join to the same message; makes one completion; checks that a
request past the context surfaces as the client's BadRequestError. Prints
{"chat": ..., "chat_finish": ..., "completion": ..., "usage": {...}} as JSON.
"""

import json
import sys

import openai


def main() -> None:
    base_url, model, prompt, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=120)

    listed = [m.id for m in client.models.list().data]
    assert listed == [model], listed

    messages = [{"role": "user", "content": prompt}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0
    )
    message = whole.choices[0].message
    assert message.role == "assistant", message

    pieces = []
    finish = None
    roles = []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
    ):
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        pieces.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"], roles
    assert "".join(pieces) == message.content, (pieces, message.content)
    assert finish == whole.choices[0].finish_reason, (finish, whole.choices[0].finish_reason)

    completion = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
    )

    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=10**6)
    except openai.BadRequestError as error:
        assert "context" in str(error), error
    else:
        raise AssertionError("max_tokens past the context was accepted")

    print(
        json.dumps(
            {
                "chat": message.content,
                "chat_finish": whole.choices[0].finish_reason,
                "completion": completion.choices[0].text,
                "usage": {
                    "prompt_tokens": whole.usage.prompt_tokens,
                    "completion_tokens": whole.usage.completion_tokens,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
