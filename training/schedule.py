"""When things happen in a phase: logging, evaluation and checkpoint steps, and where fused update blocks end."""


def every(step, interval):
    """True on multiples of a positive `interval`."""
    return interval > 0 and step % interval == 0


def is_eval_step(step, last_step, eval_interval):
    """Evaluate every `eval_interval` steps and once after the last step of a phase (never twice on one step)."""
    return step == last_step or every(step, eval_interval)


def block_end(step, max_steps, last_step, intervals=(), before=()):
    """Last step of a block of at most `max_steps` updates that follows `step`.

    The block never runs past `last_step` or the next multiple of any positive interval in `intervals` (steps that
    log, save or evaluate end a block), and stops just before the next multiple of any positive interval in
    `before` (steps that must begin a block, such as a dataset shard change).
    """
    first = step + 1
    end = min(step + max_steps, last_step)
    for interval in intervals:
        if interval > 0:
            end = min(end, -(-first // interval) * interval)
    for interval in before:
        if interval > 0:
            end = min(end, (first // interval + 1) * interval - 1)
    return max(end, first)
