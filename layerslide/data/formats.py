"""Data formats: which one a table's records are in (text, chat messages, Alpaca instructions,
prompt and completion), how a record renders to text with the character spans that carry the
loss, and how tables of records become one flat array of token ids with a mask of trained ones.

Rendering:
- text: BOS (if the tokenizer has one) + text + EOS; trained on the text and EOS.
- messages (and sharegpt conversations): the tokenizer's chat template; trained on each
  assistant turn as the template renders it (its end-of-turn marker included).
- alpaca: the chat template with instruction (+ blank line + input) as the user turn and output
  as the assistant turn; without a template, like a string prompt and completion.
- prompt_completion with strings: BOS + prompt + completion + EOS, trained on completion + EOS;
  with message lists (TRL's conversational form): the chat template, trained on the completion's
  assistant turns.
train_on_prompt trains on every token instead (BOS included)."""

from __future__ import annotations

import re
import warnings
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Sequence

    from layerslide.data.files import RecordTable

DATA_FORMATS = ("auto", "text", "messages", "alpaca", "prompt_completion")
CHAT_FORMATS = ("messages", "alpaca", "prompt_completion")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system"}
ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates know
# what other names for a role usually mean (sharegpt's, other tools')
_ROLE_FOR = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
             "ai": "assistant", "chatgpt": "assistant", "prompter": "user"}
_ACCEPTED = ("text ({text_field!r}: str; set text_field for another field), messages "
             "('messages': [{{'role', 'content'}}, ...], or sharegpt 'conversations': "
             "[{{'from', 'value'}}, ...]), alpaca ('instruction', optional 'input', 'output'), "
             "prompt_completion ('prompt', 'completion')")


# a chat template's mark of what the assistant generates, as transformers finds it
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


class RecordError(ValueError):
    """A record that cannot be rendered; the caller adds which file and record it is."""


def detect_format(table: RecordTable, data_format: str, text_field: str) -> str:
    """Return the format of a table's records: data_format if named, else the one its fields
    match, refusing fields that match none or several."""
    if table.plain_text:
        if data_format not in ("auto", "text"):
            msg = (f"{table.path} is plain text, which is read as data_format 'text'; convert it "
                   f"to JSON Lines records to use data_format {data_format!r}")
            raise ValueError(msg)
        return "text"
    if data_format != "auto":
        return data_format
    columns = set(table.columns)
    matches = _formats_fitting(columns, text_field)
    if len(matches) == 1:
        return matches[0]
    accepted = _ACCEPTED.format(text_field=text_field)
    if matches:
        _refuse_mixed_records(table, text_field)
        msg = (f"{table.path} records have fields {sorted(columns)} that fit several data "
               f"formats ({', '.join(matches)}); pass data_format as one of them ({accepted})")
    else:
        msg = (f"{table.path} records have fields {sorted(columns)}, which fit no data format; "
               f"accepted: {accepted}; rename the fields, or pass data_format (one of "
               f"{', '.join(DATA_FORMATS)}) and text_field")
    raise ValueError(msg)


def _formats_fitting(fields: set[str], text_field: str) -> list[str]:
    """The formats whose fields are all among `fields`."""
    shapes = {"text": [{text_field}], "messages": [{"messages"}, {"conversations"}],
              "alpaca": [{"instruction", "output"}], "prompt_completion": [{"prompt", "completion"}]}
    return [name for name, options in shapes.items() if any(o <= fields for o in options)]


def _refuse_mixed_records(table: RecordTable, text_field: str) -> None:
    """Refuse a table whose records are of several formats, each record of one (a table's
    columns are all its records' fields, so they fit several formats though no record does)."""
    first: dict[str, int] = {}  # format -> the first record that fits it alone
    index = 0
    for batch in table.batches():
        for record in batch:
            fits = _formats_fitting({k for k, v in record.items() if v is not None}, text_field)
            if len(fits) == 1:
                first.setdefault(fits[0], index)
            index += 1
    if len(first) < 2:
        return
    where = ", ".join(f"{table.where(i)} is a {name} record"
                      for name, i in sorted(first.items(), key=lambda item: item[1]))
    msg = (f"{table.path} mixes record formats: {where}; a run trains on one format: put each "
           "format's records in a file of their own and train on one (or convert them all to "
           "one format)")
    raise ValueError(msg)


@dataclass(frozen=True)
class Rendered:
    """One example as text, the character spans [start, end) whose tokens carry the loss,
    whether BOS goes before it and EOS after it (as ids: text would not tokenise to them), and
    how many of its assistant turns could not be found in the render (not trained on)."""

    text: str
    trained: tuple[tuple[int, int], ...]
    bos: bool = False
    eos: bool = False
    turns: int = 0  # its assistant turns to train on
    lost_turns: int = 0  # of those, the ones the chat template renders inconsistently


class Encoder:
    """Renders records of one format and tokenises them with the mask of tokens trained on."""

    def __init__(self, tokenizer: Any, data_format: str, text_field: str,
                 train_on_prompt: bool) -> None:
        self._format = data_format
        self._text_field = text_field
        self._train_on_prompt = train_on_prompt
        self._tokenizer = tokenizer
        self._bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        self._eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self._has_template = tokenizer.chat_template is not None
        if data_format == "messages" and not self._has_template:
            msg = (f"the tokenizer at {tokenizer.name_or_path} has no chat template, which "
                   "messages data is rendered with; use the model's own chat (instruct) "
                   "tokenizer, add a chat_template (chat_template.jinja) to it, or convert the "
                   "data to text records")
            raise ValueError(msg)
        if data_format in CHAT_FORMATS and not train_on_prompt and not tokenizer.is_fast:
            msg = ("masking the prompt needs a fast tokenizer (a tokenizer.json) to map "
                   "characters to tokens; add one to the model folder, or pass "
                   "train_on_prompt=True to train on every token")
            raise ValueError(msg)
        self._marked = False  # whether the template marks the assistant's turns
        if self._has_template:
            from jinja2 import TemplateError  # only chat templates need jinja2

            self._template_errors = (TemplateError, ValueError, TypeError, KeyError, IndexError)
            self._marked = bool(GENERATION_MARKER.search(tokenizer.get_chat_template()))

    def render(self, record: dict[str, Any]) -> Rendered:
        """Render one record of this encoder's format, raising RecordError if it does not fit."""
        if self._format == "text":
            text = record.get(self._text_field)
            if not isinstance(text, str):
                msg = (f"has no string field {self._text_field!r}; add it, or pass the name of "
                       "the field that holds the text as text_field")
                raise RecordError(msg)
            return Rendered(text, ((0, len(text)),), bos=True, eos=True)
        if self._format == "messages":
            sharegpt = record.get("messages") is None and record.get("conversations") is not None
            key = "conversations" if sharegpt else "messages"
            return self._render_chat(_messages(record.get(key), key), train_from=0)
        if self._format == "alpaca":
            return self._render_alpaca(record)
        return self._render_prompt_completion(record)

    def other_format(self, record: dict[str, Any]) -> str:
        """What to add to a refusal of a record that is of another format than this encoder's:
        said so, with the fix; "" if it is not."""
        fits = _formats_fitting({k for k, v in record.items() if v is not None}, self._text_field)
        if len(fits) != 1 or fits[0] == self._format:
            return ""
        return (f" (it is a {fits[0]} record, not {self._format}: if the data mixes formats, "
                "put each format's records in a file of their own and train on one)")

    def _render_alpaca(self, record: dict[str, Any]) -> Rendered:
        instruction, extra, output = (record.get(k) for k in ("instruction", "input", "output"))
        if not (isinstance(instruction, str) and isinstance(output, str)
                and isinstance(extra, str | None)):
            msg = ("needs string 'instruction' and 'output' fields (and 'input', if any, a "
                   "string): alpaca records are {instruction, input (optional), output}")
            raise RecordError(msg)
        prompt = "\n\n".join(part for part in (instruction, extra) if part)
        if self._has_template:  # an instruction-tuned model is prompted through its template
            conversation = [{"role": "user", "content": prompt},
                            {"role": "assistant", "content": output}]
            return self._render_chat(conversation, train_from=1)
        return self._plain(prompt + "\n\n", output)  # the blank line ends the prompt

    def _render_prompt_completion(self, record: dict[str, Any]) -> Rendered:
        prompt, completion = record.get("prompt"), record.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            return self._plain(prompt, completion)  # as TRL: a string prompt is the exact text
        if isinstance(prompt, list) and isinstance(completion, list):
            if not self._has_template:
                msg = (f"has message lists as prompt and completion, which need a chat template "
                       f"and the tokenizer at {self._tokenizer.name_or_path} has none; use the "
                       "model's chat tokenizer or give prompt and completion as strings")
                raise RecordError(msg)
            conversation = _messages(prompt, "prompt") + _messages(completion, "completion")
            return self._render_chat(conversation, train_from=len(prompt))
        msg = ("needs 'prompt' and 'completion' fields, both strings or both lists of "
               "messages {role, content}")
        raise RecordError(msg)

    def _plain(self, prompt: str, completion: str) -> Rendered:
        text = prompt + completion
        return Rendered(text, ((0 if self._train_on_prompt else len(prompt), len(text)),),
                        bos=True, eos=True)

    def _render_chat(self, messages: list[dict[str, Any]], train_from: int) -> Rendered:
        """Render with the chat template, training the assistant turns from message train_from
        on: those its {% generation %} markers mark, where it has them, else by prefixes."""
        full = self._template(messages)
        if self._train_on_prompt:
            return Rendered(full, ((0, len(full)),))
        _refuse_replies_under_other_roles(messages, train_from)
        if self._marked:
            return Rendered(full, self._marked_spans(messages, train_from))
        return self._by_prefixes(messages, train_from, full)

    def _by_prefixes(self, messages: list[dict[str, Any]], train_from: int, full: str,
                     ) -> Rendered:
        """Each assistant turn is what the render through it adds to the prompt rendered up to
        it with the generation prompt, where both start the full render; a turn the template
        renders otherwise once later turns follow (as templates that drop earlier turns'
        reasoning do) is not trained on, and counted as lost (the last never is)."""
        spans, turns = [], 0
        for index in range(train_from, len(messages)):
            if messages[index]["role"] != "assistant":
                continue
            if index == 0:
                msg = ("starts with an assistant turn, which has no prompt to render; start it "
                       "with a user or system turn, or pass train_on_prompt=True")
                raise RecordError(msg)
            turns += 1
            prompt = self._template(messages[:index], add_generation_prompt=True)
            through = (full if index == len(messages) - 1  # the last turn's render is the whole
                       else self._template(messages[: index + 1]))
            if through.startswith(prompt) and full.startswith(through):
                spans.append((len(prompt), len(through)))
        return Rendered(full, tuple(spans), turns=turns, lost_turns=turns - len(spans))

    def _marked_spans(self, messages: list[dict[str, Any]], train_from: int,
                      ) -> tuple[tuple[int, int], ...]:
        """The character spans of the assistant turns from message train_from on, as the
        template's {% generation %} markers mark them in the full render."""
        try:
            out = self._tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                tokenizer_kwargs={"return_offsets_mapping": True})
        except self._template_errors as err:
            msg = (f"is refused by the tokenizer's chat template ({type(err).__name__}: {err}); "
                   "fix the conversation or remove it")
            raise RecordError(msg) from err
        spans: list[tuple[int, int]] = []
        after_marked = False
        for marked, (start, end) in zip(out["assistant_masks"], out["offset_mapping"],
                                        strict=True):
            if marked and after_marked:
                spans[-1] = (spans[-1][0], end)
            elif marked:
                spans.append((start, end))
            after_marked = bool(marked)
        before = sum(m["role"] == "assistant" for m in messages[:train_from])
        if before and len(spans) != sum(m["role"] == "assistant" for m in messages):
            msg = (f"has {sum(m['role'] == 'assistant' for m in messages)} assistant turns and "
                   f"the chat template's generation markers mark {len(spans)} spans, so the "
                   f"prompt's {before} cannot be told from the reply's; mark each assistant "
                   "turn once in the template, or pass train_on_prompt=True")
            raise RecordError(msg)
        return tuple(spans[before:])

    def _template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                  ) -> str:
        try:
            return self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        except self._template_errors as err:
            msg = (f"is refused by the tokenizer's chat template ({type(err).__name__}: {err}); "
                   "fix the conversation or remove it")
            raise RecordError(msg) from err

    def encode(self, examples: Sequence[Rendered]) -> list[tuple[list[int], bytearray]]:
        """Tokenise rendered examples in one batch: each one's ids and its trained mask."""
        partial = any(not _whole(e) for e in examples)
        encoded = self._tokenizer([e.text for e in examples], add_special_tokens=False,
                                  return_offsets_mapping=partial, verbose=False)
        out = []
        for index, example in enumerate(examples):
            body = encoded["input_ids"][index]
            if _whole(example):
                mask = bytearray(b"\x01" * len(body))
            else:
                mask = _token_mask(encoded["offset_mapping"][index], example.trained)
            bos = self._bos if example.bos else []
            eos = self._eos if example.eos else []
            out.append(([*bos, *body, *eos],
                        bytearray([self._train_on_prompt] * len(bos)) + mask + b"\x01" * len(eos)))
        return out


def _whole(example: Rendered) -> bool:
    return example.trained == ((0, len(example.text)),)


def _token_mask(offsets: list[tuple[int, int]], spans: tuple[tuple[int, int], ...]) -> bytearray:
    """1 for each token whose characters overlap a span: a token that straddles the end of the
    prompt holds the answer's first characters, which the model has to produce."""
    mask = bytearray(len(offsets))
    span = 0
    for index, (start, end) in enumerate(offsets):
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span < len(spans) and start < spans[span][1] and end > spans[span][0]:
            mask[index] = 1
    return mask


def _refuse_replies_under_other_roles(messages: list[dict[str, Any]], train_from: int) -> None:
    """Refuse messages with no assistant turn to train on (from message train_from on) where
    roles the templates do not know may be holding the replies (sharegpt's 'gpt' in
    'messages')."""
    roles = [m["role"] for m in messages[train_from:]]
    others = list(dict.fromkeys(role for role in roles if role not in ROLES))
    if "assistant" in roles or not others:
        return
    named = ", ".join(f"{role!r} (message {train_from + roles.index(role)})" for role in others)
    renames = "; ".join(f"rename {role!r} to {_ROLE_FOR[role.lower()]!r}"
                        if role.lower() in _ROLE_FOR else
                        f"rename {role!r} to the role it plays ({', '.join(ROLES)})"
                        for role in others)
    sharegpt = (" (sharegpt's names belong in 'conversations' of 'from' and 'value')"
                if any(role in _SHAREGPT_ROLES for role in others) else "")
    msg = (f"has no assistant turn to train on, and roles {named} are none of "
           f"{', '.join(ROLES)}: the loss is on the 'assistant' turns; {renames}{sharegpt}")
    raise RecordError(msg)


def _messages(value: Any, key: str) -> list[dict[str, Any]]:
    """Check a list of {role, content} (or sharegpt {from, value}) messages; return them as
    {role, content, ...} dicts without the None fields Arrow fills absent keys with."""
    if not isinstance(value, list) or not value:
        msg = f"has no non-empty list of messages in {key!r}; give it [{{'role', 'content'}}, ...]"
        raise RecordError(msg)
    messages = []
    for index, raw in enumerate(value):
        message = {k: v for k, v in raw.items() if v is not None} if isinstance(raw, dict) else {}
        if "role" not in message and "from" in message:
            sender = message.pop("from")
            if sender not in _SHAREGPT_ROLES:
                msg = (f"message {index} of {key!r} is from {sender!r}; sharegpt messages are "
                       f"from one of {', '.join(_SHAREGPT_ROLES)}")
                raise RecordError(msg)
            message = {"role": _SHAREGPT_ROLES[sender], "content": message.pop("value", None),
                       **message}
        if not (isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
            msg = (f"message {index} of {key!r} needs string 'role' and 'content' (or sharegpt "
                   "'from' and 'value')")
            raise RecordError(msg)
        messages.append(message)
    return messages


@dataclass(frozen=True)
class Corpus:
    """Every example's tokens end to end, with per-example offsets and label statistics."""

    ids: torch.Tensor  # int32 [tokens]
    trained: torch.Tensor  # bool [tokens]: the token carries loss when it is a label
    starts: torch.Tensor  # int64 [examples + 1]: example i is ids[starts[i]:starts[i + 1]]
    num_trained: torch.Tensor  # int64 [examples]: its trained tokens
    first_label: torch.Tensor  # int64 [examples]: its first trained token after the first, or -1
    num_lost_turns: int = 0  # assistant turns the chat template renders inconsistently

    @property
    def lengths(self) -> torch.Tensor:
        return self.starts[1:] - self.starts[:-1]


def tokenize_tables(tables: Sequence[RecordTable], encoder: Encoder) -> Corpus:
    """Render and tokenise every record of the tables, in order, naming any that is refused."""
    ids, trained = array("i"), bytearray()
    starts, num_trained, first_label = array("q", [0]), array("q"), array("q")
    lost: dict[str, list[str]] = {}  # file -> its records that lost turns, said
    num_lost = 0
    for table in tables:
        index = 0
        for batch in table.batches():
            rendered = []
            for record in batch:
                try:
                    example = encoder.render(record)
                except RecordError as err:
                    msg = (f"{table.path} {table.where(index)} {err}"
                           f"{encoder.other_format(record)}")
                    raise ValueError(msg) from err
                num_lost += example.lost_turns
                if example.lost_turns:
                    lost.setdefault(str(table.path), []).append(
                        f"{table.where(index)} lost {example.lost_turns} of {example.turns}")
                rendered.append(example)
                index += 1
            for example_ids, mask in encoder.encode(rendered):
                ids.extend(example_ids)
                trained += mask
                starts.append(len(ids))
                num_trained.append(mask.count(1))
                first_label.append(mask.find(1, 1))
    _warn_of_lost_turns(lost)
    return Corpus(ids=_tensor(ids, torch.int32), trained=_tensor(trained, torch.bool),
                  starts=_tensor(starts, torch.int64), num_trained=_tensor(num_trained, torch.int64),
                  first_label=_tensor(first_label, torch.int64), num_lost_turns=num_lost)


def _warn_of_lost_turns(lost: dict[str, list[str]], shown: int = 5) -> None:
    """Say which conversations lost assistant turns to a template that renders them
    inconsistently, and how many each lost (the first `shown` of them by name)."""
    count = sum(map(len, lost.values()))
    if not count:
        return
    named, left = [], shown
    for path, records in lost.items():
        if left > 0:
            named.append(f"{path} {', '.join(records[:left])}")
        left -= len(records)
    more = f", and {count - shown} more" if count > shown else ""
    warnings.warn(
        f"{count} conversations lost assistant turns to the tokenizer's chat template, which "
        "renders them otherwise once later turns follow (as templates that drop earlier turns' "
        f"reasoning do), so they are not trained on: {'; '.join(named)}{more}; the turns it "
        "renders the same wherever they are (as a rule the last) are trained on. To train every "
        "turn, mark the assistant's turns in the chat template with {% generation %} ... "
        "{% endgeneration %}", stacklevel=4)


def _tensor(buffer: array | bytearray, dtype: torch.dtype) -> torch.Tensor:
    """View a filled buffer as a tensor without copying it (frombuffer refuses empty ones)."""
    return torch.frombuffer(buffer, dtype=dtype) if buffer else torch.zeros(0, dtype=dtype)
