"""Rules for the values of an agent's config keys, declared by each agent next to its `get_config()`, and the check
that applies them before anything is loaded (one line naming the key, the rule and the value).

    CONFIG_RULES = dict(lr=positive(float), batch_size=positive(int), actor_type=one_of('best-of-n', ...), ...)
    CONFIG_CHECKS = (at_most_one_positive('fql_alpha', 'edit_scale'),)  # optional: rules on several keys
"""

import numbers

from utils.errors import UsageError


class Rule:
    """A predicate on one value with the words that describe it ('a positive integer')."""

    def __init__(self, test, words, optional=False):
        self.test, self.words, self.optional = test, words, optional

    def ok(self, value):
        if value is None:
            return self.optional
        try:
            return bool(self.test(value))
        except TypeError:
            return False


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def positive(kind):
    """A positive int (`kind=int`) or a positive number (`kind=float`)."""
    if kind is int:
        return Rule(lambda v: _is_int(v) and v > 0, 'a positive integer')
    return Rule(lambda v: _is_number(v) and v > 0, 'a positive number')


def non_negative():
    return Rule(lambda v: _is_number(v) and v >= 0, 'a number >= 0')


def number():
    return Rule(_is_number, 'a number')


def fraction():
    """A number in (0, 1]: discounts, Polyak rates."""
    return Rule(lambda v: _is_number(v) and 0 < v <= 1, 'a number in (0, 1]')


def boolean():
    return Rule(lambda v: isinstance(v, bool), 'True or False')


def one_of(*choices):
    return Rule(lambda v: v in choices, 'one of ' + ', '.join(repr(c) for c in choices))


def widths():
    """Hidden layer sizes: a non-empty tuple of positive integers, e.g. (512, 512)."""
    return Rule(
        lambda v: isinstance(v, tuple | list) and len(v) > 0 and all(_is_int(w) and w > 0 for w in v),
        'a tuple of positive layer widths, e.g. (512,512)',
    )


def optional(rule):
    """`rule`, or None (unset)."""
    return Rule(rule.test, f'{rule.words} or unset', optional=True)


def at_most_one_positive(*keys):
    """A rule on several keys together (for `CONFIG_CHECKS`): at most one of them is > 0 (variants that exclude each
    other, e.g. QAM-F's `fql_alpha` and QAM-E's `edit_scale`)."""

    def check(config):
        given = [k for k in keys if (config.get(k) or 0) > 0]
        if len(given) > 1:
            return f'{" and ".join(f"--agent.{k}={config[k]}" for k in given)} exclude each other: set only one > 0'
        return None

    return check


def check_config(config, rules, where, checks=()):
    """Raises `UsageError` for the first key of `config` without a rule (not a key of this agent) or whose value
    breaks its rule, then for the first of `checks` (functions of the whole config returning an error line or None);
    `where` names the agent file in the message."""
    for key, value in config.items():
        if key not in rules:
            raise UsageError(f'{where} has no setting {key!r}')
        rule = rules[key]
        if not rule.ok(value):
            raise UsageError(f'--agent.{key} must be {rule.words}, got {value!r}')
    for check in checks:
        error = check(config)
        if error:
            raise UsageError(error)


# The rules of the keys every agent with QC's chunked critic ensemble shares (the QAM paper's agents): learning rate,
# batch, network widths and norms, chunking, the ensemble and its pessimism, discount and target rate.
CHUNKED_CRITIC_RULES = dict(
    lr=positive(float),
    batch_size=positive(int),
    actor_hidden_dims=widths(),
    actor_layer_norm=boolean(),
    value_hidden_dims=widths(),
    value_layer_norm=boolean(),
    horizon_length=optional(positive(int)),
    action_chunking=boolean(),
    num_qs=positive(int),
    rho=non_negative(),
    discount=fraction(),
    tau=fraction(),
)
