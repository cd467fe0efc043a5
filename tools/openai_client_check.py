"""Drive a running `dormouse serve` with the official `openai` Python client.

Usage: python openai_client_check.py BASE_URL MODEL PROMPT MAX_TOKENS

Makes one completion and one streamed completion (greedy), checks that the client parses
both, that the stream's pieces join to the same text, and that a bad request surfaces as the
client's BadRequestError; prints {"text": ..., "finish_reason": ...} as JSON.
"""

import json
import sys

import openai


def main() -> None:
    base_url, model, prompt, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=120)

    listed = [m.id for m in client.models.list().data]
    assert listed == [model], listed

    whole = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    text = whole.choices[0].text
    assert whole.usage.completion_tokens == max_tokens, whole.usage

    pieces = []
    finish = None
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    ):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == text, (pieces, text)
    assert finish == "length", finish

    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=10**6)
    except openai.BadRequestError as error:
        assert "max_tokens" in str(error), error
    else:
        raise AssertionError("max_tokens above the limit was accepted")

    print(json.dumps({"text": text, "finish_reason": whole.choices[0].finish_reason}))


if __name__ == "__main__":
    main()
