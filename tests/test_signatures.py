"""The three buffer constructors spell out BufferConfig's fields: same names, same order, same defaults.

StalenessBuffer, ReferenceBuffer and RemoteBuffer.create keep explicit signatures for users and type
checkers, and each hands its arguments to ``config_from_arguments``, which reads every BufferConfig field
by keyword. This test is what keeps the explicit signatures from drifting: a field added to BufferConfig
and not to a signature (or added in another place, or with another default) fails here, naming it.

Allowed extras: ``pin_memory`` in the two local buffers (where the ring's memory lives is a property of
the process, not of the configuration a checkpoint records), right after ``on_full`` where it has always
been; and RemoteBuffer.create's keyword-only Ray options (``name``, ``num_cpus``, ...) after a bare ``*``.
"""

import dataclasses
import inspect

import pytest

from pyfast_buffer import BufferConfig, ReferenceBuffer, StalenessBuffer
from pyfast_buffer.config import config_from_arguments

FIELDS = dataclasses.fields(BufferConfig)
LOCAL_EXTRAS = {"pin_memory": (None, "Optional[bool]")}
#: A value other than the default for every field.
VALUES = {
    "capacity": 9,
    "max_age": 3,
    "strategy": "pace",
    "max_uses": 2,
    "on_full": "error",
    "parameter_sync_step": 4,
    "track_released": True,
    "release_bound": 5,
    "unique_ids": True,
    "prompts_per_step": 6,
    "lookahead": 1,
    "age_from": "finish",
    "max_attempts": 2,
    "source_max_age": ((1, 4),),
    "starvation_share": 0.25,
}


def _no_default(field):
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _check(function, allowed_extras):
    """Asserts that ``function``'s positional parameters are BufferConfig's fields plus ``allowed_extras``."""
    params = list(inspect.signature(function).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    others = [p for p in params if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in others), (
        f"{function.__qualname__}: only keyword-only parameters may follow the buffer arguments, got {others}"
    )
    fields = [p for p in positional if p.name not in allowed_extras]
    names = [p.name for p in fields]
    expected = [f.name for f in FIELDS]
    assert names == expected, (
        f"{function.__qualname__}'s buffer arguments are {names}, BufferConfig's fields are {expected}: "
        "add the field to the signature, in BufferConfig's order"
    )
    for param, field in zip(fields, FIELDS):
        default = inspect.Parameter.empty if _no_default(field) else field.default
        assert param.default == default and type(param.default) is type(default), (
            f"{function.__qualname__}({param.name}=...) defaults to {param.default!r}, BufferConfig to {default!r}"
        )
        assert param.annotation == field.type, (
            f"{function.__qualname__}({param.name}: {param.annotation}) but BufferConfig.{field.name}: {field.type}"
        )
    for param in positional:
        if param.name in allowed_extras:
            default, annotation = allowed_extras[param.name]
            assert (param.default, param.annotation) == (default, annotation), param
    return positional, others


@pytest.mark.parametrize("cls", [StalenessBuffer, ReferenceBuffer])
def test_local_buffers_spell_out_buffer_config(cls):
    positional, others = _check(cls.__init__, LOCAL_EXTRAS)
    assert not others, f"{cls.__name__}() takes no keyword-only arguments, got {others}"
    names = [p.name for p in positional]
    assert names.index("pin_memory") == names.index("on_full") + 1, "pin_memory stays where it always was"


def test_remote_buffer_create_spells_out_buffer_config():
    pytest.importorskip("ray")
    from pyfast_buffer.ray import RemoteBuffer

    positional, keyword_only = _check(RemoteBuffer.create, {})
    assert "pin_memory" not in {p.name for p in positional + keyword_only}, "batches leave the actor by pickle"
    assert {p.name for p in keyword_only} >= {"name", "namespace", "lifetime", "num_cpus", "actor_options"}


def test_config_from_arguments_passes_each_field_by_keyword():
    assert set(VALUES) == {f.name for f in FIELDS}, "give the new BufferConfig field a non-default value here"
    # Shuffled, and with the extras a constructor's locals() carries: only the names matter.
    arguments = dict(reversed(list(VALUES.items())), self=object(), pin_memory=None, num_cpus=1)
    assert dataclasses.asdict(config_from_arguments(arguments)) == VALUES
    missing = dict(VALUES)
    del missing["unique_ids"]
    with pytest.raises(KeyError, match="unique_ids"):
        config_from_arguments(missing)


@pytest.mark.parametrize("cls", [StalenessBuffer, ReferenceBuffer])
def test_each_argument_reaches_its_field(cls):
    buf = cls(9, 3, "pace", 2, "error", False, 4, True, 5, True, 6, 1, "finish", 2, ((1, 4),), 0.25)
    assert dataclasses.asdict(buf.config) == VALUES
    assert buf.pin_memory is False
    buf.close()
