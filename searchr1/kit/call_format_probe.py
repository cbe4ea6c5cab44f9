"""Which registered call format a chat template writes: a tool-call protocol asks
:func:`detect_call_format` once, so the prompt, scripted turns and the parser agree. Formats
are tried in name order; at most one can match, since a match is the template's own
rendering, verbatim."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from searchr1.core.call_format import CallFormat
from searchr1.core.errors import ConfigValueError

#: The query the format probe renders; plain ASCII words so every serialiser writes it as is.
PROBE_QUERY = "searchr1 probe query"


def describe_formats(formats: Sequence[CallFormat]) -> str:
    """One line per format: name, families and an example call (for error messages)."""
    return "\n".join(f"  {f.name} ({f.families}): {f.example()!r}" for f in formats)


def detect_call_format(
    render: Callable[[list[dict[str, Any]]], str], formats: Sequence[CallFormat]
) -> CallFormat:
    """The format the chat template writes calls in: ``render(messages)`` (tools listed, no
    generation prompt) renders one structured ``search`` call with :data:`PROBE_QUERY`; the
    first format whose :meth:`CallFormat.render` appears verbatim wins. Raises
    ConfigValueError showing what the template wrote when none matches."""
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": PROBE_QUERY}}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = render(messages)
    except Exception as exc:  # a template that rejects tool calls is a config problem
        raise ConfigValueError(
            'rollout.protocol = "tool_calls": the model\'s chat template failed to render an '
            f'assistant tool call ({type(exc).__name__}: {exc}); use protocol = "tags"'
        ) from exc
    for fmt in formats:
        if fmt.render("search", {"query": PROBE_QUERY}) in text:
            return fmt
    at = text.find(PROBE_QUERY)
    shown = text[max(at - 200, 0) : at + 200] if at >= 0 else "(nothing: the call was dropped)"
    raise ConfigValueError(
        'rollout.protocol = "tool_calls": the model\'s chat template writes tool calls in a '
        f"format no installed plugin knows, so every search would be an invalid action. The "
        f"template rendered a search call as:\n{shown}\nKnown formats:\n"
        f'{describe_formats(formats)}\nUse protocol = "tags", or install a plugin that '
        "registers the format (hook register_call_formats, docs/plugins.md)"
    )
