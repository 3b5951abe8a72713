"""Character-level robustness, generated locally from held-out text (no download).

CUTE-style tasks (after Edman et al., 2024, "CUTE: Measuring LLMs' Understanding of Their Tokens"): from words of
the held-out documents (letters only, 3-10 bytes, deterministic with `seed`), each example is a question with two
solved demonstrations of the same task before it, and four candidate answers: the right one and three that differ
by one character edit (two neighbouring letters swapped, one letter replaced, one deleted); `contains` has
yes / no. Scored like the multiple-choice tasks (learntok.evaluation.tasks): the gold answer's bits per byte and
the accuracy of the lowest-per-byte-loss candidate.

    spell      Spell "river".  -> r i v e r
    unspell    Join "r i v e r". -> river
    contains   Does "river" contain "v"? -> yes / no
    insert     Put "x" after every "r" in "river". -> rxivexrx
    delete     Remove every "r" from "river". -> ive
    substitute Replace every "r" with "m" in "river". -> mivem
    swap       Swap the first two letters of "river". -> irver

Noised text: held-out documents with random byte edits at rates 1-10 % (each byte, with probability p, gets one
of: a random printable ASCII byte inserted before it, deleted, or replaced), scored as bits per byte of the noised
text; reported beside the clean text's BPB on the same documents and their difference.
"""

from __future__ import annotations

import random
import re

from learntok.evaluation.tasks import Example, score_task

CUTE_TASKS = ("spell", "unspell", "contains", "insert", "delete", "substitute", "swap")
NOISE_RATES = (0.01, 0.02, 0.05, 0.10)
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def words(docs, n: int = 2000, seed: int = 0) -> list[str]:
    """Distinct lowercase ASCII words of 3-10 letters from `docs`, shuffled with `seed` (up to n)."""
    seen: dict[str, None] = {}
    for d in docs:
        for w in re.findall(rb"(?<![A-Za-z])[A-Za-z]{3,10}(?![A-Za-z])", bytes(d)):
            seen.setdefault(w.decode().lower())
        if len(seen) >= 20 * n:
            break
    out = sorted(seen)
    random.Random(seed).shuffle(out)
    return out[:n]


def _edits(answer: str, rng: random.Random, k: int = 3) -> list[str]:
    """k distinct answers one character edit away from `answer` (swap neighbours, replace, delete)."""
    out: list[str] = []
    letters = [i for i, c in enumerate(answer) if c != " "]
    for attempt in range(100):
        if len(out) == k:
            break
        i = rng.choice(letters)
        kind = attempt % 3  # by attempt, not by success: a kind that cannot apply (a swap of "oo") is not retried
        if kind == 0 and len(letters) > 1:
            j = letters[min(letters.index(i) + 1, len(letters) - 1)] if i != letters[-1] else letters[-2]
            a, b = sorted((i, j))
            cand = answer[:a] + answer[b] + answer[a + 1:b] + answer[a] + answer[b + 1:]
        elif kind == 1:
            cand = answer[:i] + rng.choice([c for c in LETTERS if c != answer[i]]) + answer[i + 1:]
        else:
            cand = answer[:i] + answer[i + 1:]
        if cand != answer and cand not in out and cand.strip():
            out.append(cand)
    return out


def _question(task: str, w: str, rng: random.Random) -> tuple[str, str, list[str] | None]:
    """(question, answer, choices with the answer first, or None for the answer and three one-edit
    distractors) for one word."""
    c = rng.choice(w)
    other = rng.choice([x for x in LETTERS if x not in w])
    if task == "spell":  # distractors: spellings of words one edit away
        return f'Spell "{w}".', " ".join(w), [" ".join(x) for x in [w, *_edits(w, rng)]]
    if task == "unspell":
        return f'Join "{" ".join(w)}".', w, None
    if task == "contains":
        probe = c if rng.random() < 0.5 else other
        yes = probe in w
        return f'Does "{w}" contain "{probe}"?', "yes" if yes else "no", ["yes", "no"] if yes else ["no", "yes"]
    if task == "insert":
        return f'Put "{other}" after every "{c}" in "{w}".', w.replace(c, c + other), None
    if task == "delete":
        return f'Remove every "{c}" from "{w}".', w.replace(c, "") or "(nothing)", None
    if task == "substitute":
        return f'Replace every "{c}" with "{other}" in "{w}".', w.replace(c, other), None
    if task == "swap":
        return f'Swap the first two letters of "{w}".', w[1] + w[0] + w[2:], None
    raise ValueError(f"unknown CUTE task {task!r}; choose from {', '.join(CUTE_TASKS)}")


def cute_examples(task: str, vocab: list[str], n: int = 200, seed: int = 0) -> list[Example]:
    """n examples of one task, each with two demonstrations and four candidates (two for `contains`)."""
    rng = random.Random(f"{task}:{seed}")
    out = []
    for k in range(n):
        picks = [vocab[(3 * k + j) % len(vocab)] for j in range(3)]
        demos = [_question(task, w, rng)[:2] for w in picks[:2]]
        q, answer, fixed = _question(task, picks[2], rng)
        choices = fixed or [answer, *_edits(answer, rng)]
        order = list(range(len(choices)))
        rng.shuffle(order)
        context = "".join(f"{dq}\nAnswer: {da}\n\n" for dq, da in demos) + f"{q}\nAnswer:"
        out.append(Example(context.encode(), tuple((" " + choices[i]).encode() for i in order),
                           order.index(choices.index(answer)), f"cute:{task}:{k}"))
    return out


def add_noise(data: bytes, rate: float, rng: random.Random) -> bytes:
    """`data` with each byte edited with probability `rate`: a printable ASCII byte inserted before it, the byte
    deleted, or replaced by one (a third each)."""
    out = bytearray()
    for b in data:
        if rng.random() >= rate:
            out.append(b)
            continue
        kind = rng.randrange(3)
        if kind == 0:
            out += bytes([rng.randrange(32, 127), b])
        elif kind == 2:
            out.append(rng.randrange(32, 127))
    return bytes(out)


def robustness(model, docs, window: int, bm, *, n: int = 200, tasks=CUTE_TASKS, rates=NOISE_RATES,
               noise_bytes: int = 65_536, seed: int = 0, batch_size: int = 16) -> dict:
    """CUTE-style task metrics and noised-text BPB of `model` on held-out `docs` (see the module docstring)."""
    from learntok.data import ByteSequences, head_documents
    from learntok.evaluation.bpb import heldout_bpb

    vocab = words(docs, seed=seed)
    if not vocab and tasks:
        raise ValueError("--robustness: the held-out text has no ASCII word of 3 to 10 letters to build the "
                         "CUTE-style tasks from (they spell English words); give English text with --data")
    cute = {}
    for task in tasks:
        res = score_task(model, task, cute_examples(task, vocab, n, seed), window, bm, batch_size=batch_size,
                         kind="choice", values=True)
        cute[task] = {k: res[k] for k in ("n", "bpb", "bpb_se", "acc", "acc_se", "chance", "values")}
    kept = head_documents(docs, noise_bytes)
    total = sum(map(len, kept))

    def bpb(texts: list[bytes]) -> float:
        seqs = ByteSequences(texts, window, True, name="robustness", annotate=model.boundary.annotator)
        return heldout_bpb(model, seqs, bm, batch_size=batch_size, progress=False)["bpb"]

    clean = bpb(kept)
    noise = {}
    for rate in rates:
        rng = random.Random(f"noise:{rate}:{seed}")
        got = bpb([add_noise(t, rate, rng) for t in kept])
        noise[f"{rate:g}"] = {"bpb": got, "delta": got - clean}
    return {"words": len(vocab), "cute": cute, "noise": {"bytes": total, "clean_bpb": clean, "rates": noise}}


def format_robustness(r: dict) -> str:
    """A table of a robustness result."""
    from learntok.evaluation.tasks import format_metric

    lines = [f"character-level robustness (CUTE-style, {r['words']} held-out words)",
             f"  {'task':<11} {'n':>5}  {'BPB of gold':<17} {'accuracy':<17} chance"]
    for name, t in r["cute"].items():
        lines.append(f"  {name:<11} {t['n']:>5}  {format_metric(t['bpb'], t['bpb_se']):<17} "
                     f"{format_metric(t['acc'], t['acc_se']):<17} {t['chance']:.2f}")
    nz = r["noise"]
    lines.append(f"  noised text ({nz['bytes']:,} bytes; clean BPB {nz['clean_bpb']:.4f}): " + ", ".join(
        f"{float(k):.0%} edits {v['bpb']:.4f} ({v['delta']:+.4f})" for k, v in nz["rates"].items()))
    return "\n".join(lines)
