"""Start or join Ray from a driver without losing the driver's own SIGTERM handling, hand every
Ray process the driver's Hugging Face / layerswap environment, and keep Ray's and Tune's own
notices out of a command's output unless it runs with --verbose.

Every layerswap driver (demo, search, sweep, `train` on Ray) calls `init_ray(...)` where it
would call `ray.init(...)`, and runs Tune inside `tune_output(verbose)`; tests:
tests/trainables/test_ray_session.py, tests/cli/test_ray_output.py, and the process-group SIGTERM
test in tests/cli/test_interrupts.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import ray

# private, both: see _own_session (Ray is pinned, 2.60.0)
from ray._private import services as _ray_services
from ray._private import utils as _ray_utils

# Where ray.init logs "Token authentication is enabled for this Ray cluster..." (a WARNING of
# ray/_private/authentication/authentication_token_setup.py) when it starts a local cluster.
# Its documented switch, RAY_AUTH_MODE, would change the authentication itself (and "token"
# would refuse a running cluster started without it), so only the notice is held back.
_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
# Tune's new output engine prints its configuration box, "View detailed results here" and a
# TensorBoard hint at every start, even at RunConfig(verbose=0); RAY_AIR_NEW_OUTPUT=0 selects the
# legacy engine, which prints nothing at verbose=0 (ray/tune/experimental/output.py, tune.py).
_NEW_OUTPUT = "RAY_AIR_NEW_OUTPUT"

# What every Ray process gets from the driver's environment (ray.init's job-level runtime_env):
# on a `ray up` cluster a worker is started by its node's raylet and inherits none of the
# driver's variables, so a token set where the command runs never reached the training workers
# (a gated Llama → 401), and a user's HF_HUB_OFFLINE=0 never reached a trial, which then went
# offline by layerswap's default and could not fetch a built-in lm-eval task. The list is what
# the code reading the Hub, datasets and cloud storage reads (huggingface_hub's constants,
# datasets' config, pyarrow's S3/GCS clients, trainables/storage.py, which also keys its cache
# on the S3 endpoint); tests/trainables/test_worker_env_names.py checks it against those and
# against the variables docs/guides/cluster.md tells users to set. A variable naming a file
# (HF_TOKEN_PATH, GOOGLE_APPLICATION_CREDENTIALS, AWS_*_FILE) passes only its path: the file
# must be at that path on every node (e.g. on the shared /mnt/layerswap). Credentials passed
# this way are readable by whoever can read the job's runtime_env (the Ray dashboard); on a
# shared cluster prefer secrets set on the nodes themselves (cluster.yaml, an instance role).
WORKER_ENV = (
    # The Hub: token, endpoint, caches, offline switches (huggingface_hub, datasets, transformers).
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_XET_CACHE",
    "HF_DATASETS_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_ENABLE_HF_TRANSFER",
    # S3 (pyarrow's S3 client, the AWS SDK's usual variables) and GCS.
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
WORKER_ENV_PREFIXES = ("LAYERSWAP_",)  # layerswap's own switches, e.g. LAYERSWAP_ALLOW_CPU


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's variables every Ray worker gets: WORKER_ENV and LAYERSWAP_*, where set.

    Args:
        environ: the environment to read (default os.environ).
    Returns:
        {name: value} of those that are set.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in WORKER_ENV or k.startswith(WORKER_ENV_PREFIXES)}


def init_ray(*, verbose: bool = False, **kwargs) -> None:
    """`ray.init(**kwargs)`, then the caller's Python SIGTERM handler again, made to pass `ray.get`
    (a default or ignored SIGTERM is left to Ray's handler). Unless `verbose`, Ray's token
    authentication notice is not printed (the authentication is unchanged).

    `ray.init` replaces the driver's SIGTERM handler with `sys.exit(SIGTERM)`, and its core
    worker puts a C++ handler in front that dumps a stack and arms `alarm(3)` to abort. A
    driver blocked in `ray.get` passes only KeyboardInterrupt out of a signal handler (any other
    exception ends the process with exit 1). With the caller's handler back (as a Python
    handler, which also takes the signal from the C++ one), the CLI's handler records SIGTERM
    and the command exits 143 after Ray has shut down.

    The processes a local `ray.init` starts (GCS, raylet, dashboard, and the workers the raylet
    forks) run in a session of their own (`_own_session`), so a SIGTERM that a scheduler or
    `timeout` sends to the command's whole process group reaches the driver alone, which then
    shuts Ray down in order. Measured before, with them in the driver's group: Ray's processes
    died with the driver's signal and the driver either exited 1 within 0.3 s with no line
    (its core worker ending itself) or sat in Ray's client of the dead GCS until the CLI's 25 s
    watchdog ended it without cleaning up (5 of 5 runs of the group-SIGTERM test). The GCS and
    raylet still end with the driver (Ray starts them with PR_SET_PDEATHSIG on Linux), and the
    workers with the raylet; the raylet's dashboard and runtime-env agents, which a group
    SIGKILL used to reach, end ~60 s later (measured), as after a SIGKILL of the driver alone.

    Every Ray process of the job gets `worker_env()` (the caller's own runtime_env env_vars
    win where both name a variable).

    Args:
        verbose: also Ray's notices while it starts (the command's --verbose).
        kwargs: passed to `ray.init`.
    """
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = worker_env() | dict(runtime_env.get("env_vars") or {})
    kwargs["runtime_env"] = runtime_env
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    notice = logging.getLogger(_AUTH_NOTICE_LOGGER)
    level = notice.level
    if not verbose:
        notice.setLevel(logging.ERROR)
    try:
        with _own_session():
            ray.init(**kwargs)
    finally:
        notice.setLevel(level)
    if callable(before):
        signal.signal(signal.SIGTERM, through_ray_get(before))


def started_here() -> bool:
    """Whether this process started the Ray cluster it is connected to (a local head it ends),
    rather than joining a running one."""
    node = ray._private.worker._global_node  # private: Ray pinned 2.60.0; None on a Ray client
    return node is not None and bool(node.head)


def cluster_line() -> str:
    """Which Ray cluster this driver is on (after `init_ray`): its address, and whether the driver
    started it or joined a running one.

    `ray.init()` with no address joins the cluster RAY_ADDRESS names, else the one Ray last
    recorded as started on this machine (/tmp/ray/ray_current_cluster), e.g. someone else's on
    a shared host: intended on a cluster's head, a surprise elsewhere, so a command says which.
    """
    address = ray.get_runtime_context().gcs_address
    if started_here():
        return f"Ray: started a local cluster at {address} (ends with this command)"
    found = os.environ.get("RAY_ADDRESS") or ""
    how = f"RAY_ADDRESS={found}" if found else "found running on this machine"
    return f"Ray: joined the running cluster at {address} ({how}; RAY_ADDRESS=local starts a private one)"  # fmt: skip


@contextmanager
def _own_session() -> Iterator[None]:
    """While open, the processes Ray starts for a local node run in a new session
    (`start_new_session=True`): not in the caller's process group, and without its terminal.

    Ray starts every node process through `ray._private.services.ConsolePopen` (a
    `subprocess.Popen` subclass, looked up at each call of `start_ray_process`), so this swaps
    in a subclass for the duration; tests/trainables/test_ray_session.py fails loudly if Ray
    stops doing so. Nothing is changed when the caller joins an existing cluster (no process is
    started), and where the kernel cannot end the children with their parent (no
    PR_SET_PDEATHSIG, Ray's `detect_fate_sharing_support`) they stay in the caller's group,
    which Ray's reaper relies on.
    """
    base = _ray_services.ConsolePopen
    if not _ray_utils.detect_fate_sharing_support():
        yield
        return

    class OwnSessionPopen(base):
        def __init__(self, *args, **kwargs):
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    _ray_services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        _ray_services.ConsolePopen = base


@contextmanager
def tune_output(verbose: bool) -> Iterator[None]:
    """Around `Tuner.fit()`: Tune's configuration box, results path and TensorBoard hint, and
    Optuna's INFO log (e.g. "A new study created"), only when `verbose`; layerswap prints its
    own progress lines. Errors and warnings still show.

    Args:
        verbose: the command's --verbose.
    """
    if verbose:
        yield
        return
    import optuna

    env, optuna_level = os.environ.get(_NEW_OUTPUT), optuna.logging.get_verbosity()
    os.environ[_NEW_OUTPUT] = "0"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(optuna_level)
        if env is None:
            os.environ.pop(_NEW_OUTPUT, None)
        else:
            os.environ[_NEW_OUTPUT] = env


def through_ray_get(handler: Callable) -> Callable:
    """`handler`, with whatever it raises other than KeyboardInterrupt raised as one.

    The caller decides what the signal means (the CLI records it and exits 143); the exception
    only has to reach the caller's `finally` blocks, and out of `ray.get` only KeyboardInterrupt
    does.
    """
    if getattr(handler, "passes_ray_get", False):
        return handler

    def on_sigterm(signum, frame):
        try:
            handler(signum, frame)
        except KeyboardInterrupt:
            raise
        except BaseException:
            raise KeyboardInterrupt from None

    on_sigterm.passes_ray_get = True
    return on_sigterm
