"""Conversations inferred from prompt block hashes, for traces that do not record them.

A trace such as Mooncake's lists requests, not conversations, but its block
hashes show which request resends another's whole context. The rule
(docs/workloads.md, "Conversations inferred from block hashes"):

* Request R *continues* an earlier request E when E's full-block hashes are
  a non-empty prefix of R's: R resends all of E's cacheable context (a later
  turn adds E's answer and a new message after it; a retry or another
  question on the same context adds nothing new in whole blocks). Only full
  blocks count: a trailing partial block is never part of the hashes, and it
  changes when the conversation goes on.
* A prefix that later prompts continue in two or more different ways (its
  node in the prefix tree has two or more children, over the whole trace) is
  *shared*, like a system prompt or a common document, not a conversation's
  turn: nobody continues a request whose whole context is such a prefix. So
  a request that is only a system prompt plus a short message (its user text
  in the partial block) does not pull every later request with that system
  prompt into its conversation.
* Among the earlier requests R continues, R joins the conversation of the one
  with the longest prefix (the latest turn it contains); if there is none, R
  starts a conversation.

Arrival order is the order given (a trace's sessions are sorted by arrival).
Time O(total blocks): one pass builds the prefix tree (a dict from (parent
node, hash) to node, so hashes need not be chained), one walks it. Called
once per trace load; the result depends on the hashes and the order only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from longroute.workloads.types import Session

__all__ = ["conversation_roots", "infer_conversations"]


def _prefix_tree(prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """Each prompt's path of node ids (node i = a distinct hash prefix; root 0, no prompt
    ends there) and every node's number of children."""
    children: dict[tuple[int, int], int] = {}
    num_children = [0]
    paths: list[list[int]] = []
    for hashes in prompts:
        node = 0
        path: list[int] = []
        for block_hash in hashes:
            child = children.get((node, block_hash))
            if child is None:
                child = len(num_children)
                children[(node, block_hash)] = child
                num_children.append(0)
                num_children[node] += 1
            node = child
            path.append(node)
        paths.append(path)
    return paths, num_children


def conversation_roots(prompts: Sequence[Sequence[int]]) -> list[int]:
    """For each prompt (full-block hashes, in arrival order), the index of its conversation's
    first prompt (its own index when it starts one), by the rule in the module docstring."""
    paths, num_children = _prefix_tree(prompts)
    # node -> root of the conversation of the earlier prompts that end there
    ends: dict[int, int] = {}
    roots: list[int] = []
    for index, path in enumerate(paths):
        root = index
        for node in path:
            found = ends.get(node)
            if found is not None:
                root = found  # deeper nodes come later: the longest continued prefix wins
        roots.append(root)
        if path and num_children[path[-1]] <= 1:
            ends.setdefault(path[-1], root)
    return roots


def infer_conversations(sessions: Sequence[Session]) -> tuple[Session, ...]:
    """``sessions`` (one-turn trace requests, in arrival order) with ``conversation_id`` set
    to the first request's session id on every later request of a conversation.

    Only ``turns[0].block_hashes`` are read. O(total blocks).
    """
    roots = conversation_roots([session.turns[0].block_hashes for session in sessions])
    return tuple(
        session if root == index else replace(session, conversation_id=sessions[root].conversation)
        for index, (session, root) in enumerate(zip(sessions, roots, strict=True))
    )
