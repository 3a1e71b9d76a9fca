"""What `benchmarks.reference_grads` computes with one code's agent: losses, infos and gradients of every loss, the
adjoints (QAM), one `update`, U fused updates and sampled actions, on one fixed batch with fixed keys; and what
`benchmarks.reference_losses` computes: the infos of many updates on given batches (`trajectory`).

It imports only numpy and JAX, so the reference's process runs it as a script from the reference's checkout
(`python <this file> --case=... --out=...`, the reference first on PYTHONPATH) and this project imports it; both sides
run the same code on their own agent. Where the two codes split their keys differently (this project's ACFQL keeps
the QC reference's splits; the QAM reference's `fql.py` has its own), the reference's side records every Gaussian
and uniform draw in call order and this project's side replays them (`Draws`), eagerly (`jax.disable_jit`), so both
see the same noise.
"""

import argparse
import contextlib
import json

import jax
import jax.numpy as jnp
import numpy as np

OBS_DIM, ACTION_DIM, HORIZON, BATCH, UPDATES = 9, 3, 4, 16, 3
SEED = 0  # the agent's seed (same initial params on both sides when the networks match)


def make_batch(seed, leading=()):
    """A `sample_sequence`-style batch (numpy) with the cases the losses treat apart: chunks cut by an episode end
    (`valid` 0 after it, `masks` 0 at a terminal), actions at the bounds +-1, nonzero rewards."""
    rng = np.random.default_rng(seed)
    shape = (*leading, BATCH)
    actions = rng.uniform(-1, 1, (*shape, HORIZON, ACTION_DIM))
    actions[rng.random(actions.shape) < 0.1] = 1.0
    actions[rng.random(actions.shape) < 0.1] = -1.0
    ends = rng.integers(1, 3 * HORIZON, shape)  # the episode ends after step `end` of the chunk (when < HORIZON)
    steps = np.arange(HORIZON)
    valid = (steps < ends[..., None]) | (ends[..., None] >= HORIZON)
    terminal_rows = rng.random(shape) < 0.3
    masks = np.where(terminal_rows[..., None] & ~valid, 0.0, 1.0)
    return dict(
        observations=rng.normal(size=(*shape, OBS_DIM)).astype(np.float32),
        actions=actions.astype(np.float32),
        rewards=np.cumsum(rng.normal(size=(*shape, HORIZON)), axis=-1).astype(np.float32),
        masks=masks.astype(np.float32),
        terminals=(1.0 - valid).astype(np.float32),
        valid=valid.astype(np.float32),
        next_observations=rng.normal(size=(*shape, HORIZON, OBS_DIM)).astype(np.float32),
    )


def flatten(tree, prefix):
    """{prefix/path: numpy array} of a nested dict."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out[prefix + '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)] = np.asarray(leaf)
    return out


class Draws:
    """Records (`draws=None`) or replays (`draws` a list) every `jax.random.normal` and `jax.random.uniform` result
    in call order, within a `with` block."""

    def __init__(self, draws=None):
        self.recording = draws is None
        self.draws = [] if draws is None else list(draws)
        self.count = 0
        self.by_key = {}

    def _wrap(self, original):
        def draw(key, shape=(), *args, **kwargs):
            if self.recording:
                value = original(key, shape, *args, **kwargs)
                self.draws.append(np.asarray(value))
                return value
            fingerprint = np.asarray(jax.random.key_data(key)).tobytes()
            if fingerprint in self.by_key:  # a key drawn again gives the same numbers, in either code
                value = self.by_key[fingerprint]
            else:
                value = self.draws[self.count]
                self.count += 1
                self.by_key[fingerprint] = value
            if value.size != int(np.prod(shape)):
                raise ValueError(f'draw {self.count} has {value.size} values, the code asks for shape {shape}')
            if value.ndim == 2 and value.shape[::-1] == tuple(d for d in shape if d != 1):
                value = value.T  # tensorflow_probability draws (event, batch) and transposes; distrax (batch, event)
            return jnp.asarray(value).reshape(shape)

        return draw

    @contextlib.contextmanager
    def active(self):
        saved = jax.random.normal, jax.random.uniform
        jax.random.normal, jax.random.uniform = self._wrap(saved[0]), self._wrap(saved[1])
        try:
            with jax.disable_jit():
                yield self
        finally:
            jax.random.normal, jax.random.uniform = saved
        if not self.recording and self.count != len(self.draws):
            raise ValueError(f'the code used {self.count} of the {len(self.draws)} recorded draws')


def probe(agent, adjoint=None, replay=None, losses=None, driver=None, one_observation=False):
    """Everything compared and the parameters (`params/`), as {name: numpy array}; `adjoint(agent, observations,
    key)` gives (xs, adjs, ts, info); `losses` maps 'total', 'critic' or 'actor' to a `(agent, batch, params, key)
    -> (loss, info)` where one code splits a loss differently (default: the agent's `<name>_loss` method);
    `driver` = (update(agent, batch), batch_update(agent, batches)) where a code's driver calls them differently
    (default: the agent's `update` and `batch_update`); `one_observation`: sample actions for the first
    observation only (a reference whose `sample_actions` takes one).

    `replay`: None to use the keys (both codes split them alike), {} to record the draws (they come back under
    `draws/<computation>/<i>`), or such a record to replay it.
    """
    batch = make_batch(1)
    batches = make_batch(2, leading=(UPDATES,))
    observations = make_batch(3)['observations']
    keys = dict(zip(('total', 'critic', 'actor', 'adjoint', 'actions'), jax.random.split(jax.random.PRNGKey(7), 5)))
    out = flatten(agent.network.params, 'params/')

    def run(name, fn):
        if replay is None:
            return fn()
        draws = Draws(None if not replay else [replay[f'draws/{name}/{i}'] for i in range(replay[f'ndraws/{name}'])])
        with draws.active():
            result = fn()
        if draws.recording:
            out.update({f'draws/{name}/{i}': d for i, d in enumerate(draws.draws)})
            out[f'ndraws/{name}'] = np.asarray(len(draws.draws))
        return result

    def loss_and_grads(name, method, key):
        def fn(params):
            if losses and name in losses:
                return losses[name](agent, batch, params, key)
            return getattr(agent, method)(batch, params, key)

        grad_fn = jax.value_and_grad(fn, has_aux=True)
        return grad_fn(agent.network.params) if replay is not None else jax.jit(grad_fn)(agent.network.params)

    for name, method in (('total', 'total_loss'), ('critic', 'critic_loss'), ('actor', 'actor_loss')):
        (loss, info), grads = run(name, lambda m=method, n=name: loss_and_grads(n, m, keys[n]))
        out[f'{name}/loss'] = np.asarray(loss)
        out.update(flatten(info, f'{name}/info/'))
        out.update(flatten(grads, f'{name}/grad/'))
    if adjoint is not None:
        xs, adjs, ts, info = run('adjoint', lambda: adjoint(agent, observations, keys['adjoint']))
        out.update({'adjoint/xs': np.asarray(xs), 'adjoint/adjs': np.asarray(adjs), 'adjoint/ts': np.asarray(ts)})
        out.update(flatten(info, 'adjoint/info/'))
    update, batch_update = driver or (lambda a, b: a.update(b), lambda a, b: a.batch_update(b))
    new_agent, info = run('update', lambda: update(agent, batch))
    out.update(flatten(new_agent.network.params, 'update/params/'))
    out.update(flatten(info, 'update/info/'))
    if replay is None:  # a scan traces its body once: no per-step replay
        new_agent, _ = batch_update(agent, batches)
        out.update(flatten(new_agent.network.params, 'batch_update/params/'))
    acting = observations[0] if one_observation else observations
    out['actions'] = np.asarray(run('actions', lambda: agent.sample_actions(acting, rng=keys['actions'])))
    return out


def trajectory(agent, batches, update=None):
    """The parameters `agent` starts from (`params/`) and its infos over one update per batch of `batches`
    ({field: (steps, B, ...)}), as {`info/<key>`: (steps,) array}; `update(agent, batch)` where a code's driver calls
    it differently."""
    update = update or (lambda a, b: a.update(b))
    out = flatten(agent.network.params, 'params/')
    rows = []
    for i in range(len(batches['observations'])):
        agent, info = update(agent, {k: v[i] for k, v in batches.items()})
        rows.append(flatten(jax.device_get(info), 'info/'))
    out.update({key: np.stack([row[key] for row in rows]) for key in rows[0]})
    return out


def batch_inputs(batches):
    """The example observation and action `create` gets, and the horizon, from `trajectory`'s batches."""
    actions = batches['actions']  # (steps, B, H, A)
    return batches['observations'][0, 0], actions[0, 0, 0], actions.shape[2]


def example_inputs():
    """The example observation and action `create` gets."""
    return np.zeros(OBS_DIM, np.float32), np.zeros(ACTION_DIM, np.float32)


def reference_calls(config):
    """`probe`'s keywords for the reference's agent where its calls differ from the others': IFQL's critic loss
    takes no key and its sampler one observation at a time; for
    ReBRAC (by name, as their `main.py` does) `total_loss` takes the key by name after a `full_update` switch, and
    the driver runs `update(batch, full_update=i % actor_freq == 0)` at offline step i = 1, 2, ..."""
    if config['agent_name'] == 'ifql':  # its critic loss takes no key; its sampler one observation at a time
        return dict(losses={'critic': lambda agent, batch, params, key: agent.critic_loss(batch, params)},
                    one_observation=True)  # fmt: skip
    if config['agent_name'] != 'rebrac':
        return {}
    freq = config['actor_freq']

    def batch_update(agent, batches):
        for i in range(1, UPDATES + 1):
            batch = {k: v[i - 1] for k, v in batches.items()}
            agent, info = agent.update(batch, full_update=i % freq == 0)
        return agent, info

    return dict(
        losses={'total': lambda agent, batch, params, key: agent.total_loss(batch, params, rng=key)},
        driver=(lambda agent, batch: agent.update(batch, full_update=1 % freq == 0), batch_update),
    )


def reference_main():
    """The reference's side: builds its agent for `--config` and writes `probe`'s arrays and the params."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--module', required=True, help="the reference's agent module, e.g. agents.qam")
    parser.add_argument('--config', required=True, help='JSON of the config keys to set')
    parser.add_argument('--record', action='store_true', help='record the draws (the codes split keys apart)')
    parser.add_argument('--batches', help="an .npz of batches: `trajectory`'s infos instead of `probe`'s arrays")
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    import importlib

    module = importlib.import_module(args.module)
    config = module.get_config()
    config.update({k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.config).items()})
    cls = next(v for k, v in vars(module).items() if k.endswith('Agent') and k != 'Agent')
    if args.batches:
        batches = dict(np.load(args.batches))
        observation, action, config['horizon_length'] = batch_inputs(batches)
        np.savez(args.out, **trajectory(cls.create(SEED, observation, action, config), batches))
        return
    config['horizon_length'] = HORIZON
    agent = cls.create(SEED, *example_inputs(), config)
    adjoint = (lambda a, obs, key: a.adj_matching(obs, key)) if hasattr(agent, 'adj_matching') else None
    out = probe(agent, adjoint, replay={} if args.record else None, **reference_calls(config))
    np.savez(args.out, **out)


if __name__ == '__main__':
    reference_main()
