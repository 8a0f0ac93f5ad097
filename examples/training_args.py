"""The command-line arguments the two data-parallel training examples share (train_ddp.py,
train_torch_ddp.py): the model, the batch, the optimizer, the buckets, the check, the
checkpoints."""
import argparse

import checkpoint


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """A parser with the shared arguments (``defaults``: see ``add_arguments``); add the
    example's own, then ``parse``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, **defaults)
    checkpoint.add_arguments(p)
    return p


def parse(p: argparse.ArgumentParser, argv, n_train: int) -> argparse.Namespace:
    """Parse and check ``argv`` (``n_train``: the training samples a batch may not exceed)."""
    args = p.parse_args(argv)
    checkpoint.check_arguments(p, args)
    check(p, args)
    if args.batch > n_train:
        p.error(f"--batch must be at most the {n_train} training samples")
    return args


def add_arguments(p, *, depth: int, steps: int, batch: int, lr: float, bucket_mb: float,
                  bucket_help: str) -> None:
    """Add --steps, --batch, --hidden, --lr, --momentum, --bucket-mb, --seed and --check."""
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--batch", type=int, default=batch,
                   help=f"global batch, split evenly over the ranks (default {batch})")
    p.add_argument("--hidden", type=int, default=256,
                   help=f"width of the {depth} hidden layers (default 256)")
    p.add_argument("--lr", type=float, default=lr, help=f"SGD learning rate (default {lr})")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--bucket-mb", type=float, default=bucket_mb,
                   help=f"gradient bucket cap in MB (default {bucket_mb:g}: {bucket_help})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the data set and the init (default 0)")
    p.add_argument("--check", action="store_true",
                   help="verify that replicas are identical and match a single-process run; "
                        "exit 1 if not")


def check(p, args) -> None:
    """Refuse sizes that cannot train (p.error exits with the usage)."""
    for name in ("steps", "batch", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be positive")
    if args.bucket_mb <= 0:
        p.error("--bucket-mb must be positive")
