//! `BlockTrie`: the catalog's block-prefix index, a compressed trie of the stored checkpoints' block-key
//! chains. A node holds a run of keys that every checkpoint through it shares; a checkpoint's chain ends at
//! the end of a node's run (`ends`). Inserting a checkpoint walks its chain node by node (a node's first child
//! checked directly, other children by one hash probe, then a sequential comparison of the keys within the
//! child's run) instead of probing a map once per block key; a lookup walks the query's keys the same way.
//! Removing one starts at its end node, which keeps its identity from insert to removal (a split gives the
//! head of a run to a new node, a merge keeps the child), and goes up only while nodes are left without a
//! checkpoint or had its serial as their newest.
//!
//! Shape: every node but the root holds at least one key and either ends a checkpoint or has two children or
//! more (a node left with neither is deleted, one left with a single child merges into it), so there are at
//! most two nodes per stored checkpoint. Each node knows the newest (largest) serial ending in its subtree,
//! the answer of the common block-prefix lookup. The trie assumes nothing about the keys: two checkpoints
//! share a node only where their keys are equal from the first block on.

use std::collections::HashMap;

use kv_pool::{BlockKey, BlockKeyHashBuilder};

use super::holders::Holders;

/// Index of a node in the trie's slab.
pub(super) type NodeIdx = usize;

const ROOT: NodeIdx = 0;
const NONE: NodeIdx = NodeIdx::MAX;

#[derive(Debug)]
struct Node {
    /// The run of keys this node adds below its parent, at chain positions `start..start + keys.len()`;
    /// empty for the root (and a freed slot) only.
    keys: Vec<BlockKey>,
    start: usize,
    parent: NodeIdx,
    first_child: NodeIdx,
    prev_sibling: NodeIdx,
    next_sibling: NodeIdx,
    n_children: usize,
    /// Serials of the checkpoints whose chain ends at the end of `keys`, ascending.
    ends: Holders,
    /// The largest serial ending in this node's subtree (meaningless for the root).
    newest: u64,
}

impl Node {
    fn new(keys: Vec<BlockKey>, start: usize, parent: NodeIdx) -> Node {
        Node {
            keys,
            start,
            parent,
            first_child: NONE,
            prev_sibling: NONE,
            next_sibling: NONE,
            n_children: 0,
            ends: Holders::none(),
            newest: 0,
        }
    }
}

/// The block-prefix index: stored checkpoints' block-key chains, by serial.
#[derive(Debug)]
pub(super) struct BlockTrie {
    nodes: Vec<Node>,
    free: Vec<NodeIdx>,
    /// The child of a node whose run starts with a key: `(parent, first key) -> child`.
    edges: HashMap<(NodeIdx, BlockKey), NodeIdx, BlockKeyHashBuilder>,
}

impl BlockTrie {
    pub(super) fn new() -> Self {
        Self {
            nodes: vec![Node::new(Vec::new(), 0, NONE)],
            free: Vec::new(),
            edges: HashMap::with_hasher(BlockKeyHashBuilder::new()),
        }
    }

    /// Records that the checkpoint `serial` (larger than every serial inserted before) holds the chain
    /// `keys`, and returns the node its chain ends at: it stays that checkpoint's end node until `remove`
    /// (splits and merges keep the identity of a node that ends a chain). A chain without a full block is not
    /// indexed (`None`).
    pub(super) fn insert(&mut self, keys: &[BlockKey], serial: u64) -> Option<NodeIdx> {
        if keys.is_empty() {
            return None;
        }
        let (mut node, mut pos) = (ROOT, 0);
        let end = loop {
            if pos == keys.len() {
                break node;
            }
            let Some(child) = self.child(node, &keys[pos]) else {
                let leaf = self.alloc(Node::new(keys[pos..].to_vec(), pos, node));
                self.link_child(node, leaf);
                let _previous = self.edges.insert((node, keys[pos]), leaf);
                break leaf;
            };
            let run = &self.nodes[child].keys;
            let shared = common_len(run, &keys[pos..]);
            node = if shared < run.len() {
                self.split(child, shared)
            } else {
                child
            };
            pos += shared;
        };
        self.nodes[end].ends.push(serial);
        let mut at = end;
        while at != ROOT {
            self.nodes[at].newest = serial;
            at = self.nodes[at].parent;
        }
        Some(end)
    }

    /// Forgets the checkpoint `serial`, whose chain ends at `end` (what `insert` returned); nothing when
    /// `end` does not end it.
    pub(super) fn remove(&mut self, end: NodeIdx, serial: u64) {
        if end == ROOT
            || !self
                .nodes
                .get_mut(end)
                .is_some_and(|node| node.ends.remove(serial))
        {
            return;
        }
        // Delete the nodes left without a checkpoint, from the end up, then merge a node left with one child.
        let mut node = end;
        while node != ROOT && self.nodes[node].ends.is_empty() && self.nodes[node].n_children == 0 {
            let parent = self.nodes[node].parent;
            self.delete_leaf(node);
            node = parent;
        }
        if node != ROOT && self.nodes[node].ends.is_empty() && self.nodes[node].n_children == 1 {
            let parent = self.nodes[node].parent;
            self.merge_into_child(node);
            node = parent;
        }
        // Only ancestors whose newest was `serial` change.
        while node != ROOT && self.nodes[node].newest == serial {
            self.nodes[node].newest = self.newest_below(node);
            node = self.nodes[node].parent;
        }
    }

    /// The node holding the last key of the longest run of leading `keys` some indexed chain shares, with that
    /// run's length in blocks; `None` when no chain shares the first key.
    pub(super) fn deepest(&self, keys: &[BlockKey]) -> Option<(NodeIdx, usize)> {
        let (mut node, mut pos) = (ROOT, 0);
        let mut found = None;
        while pos < keys.len() {
            let Some(child) = self.child(node, &keys[pos]) else {
                break;
            };
            let run = &self.nodes[child].keys;
            let shared = common_len(run, &keys[pos..]);
            pos += shared;
            found = Some((child, pos));
            if shared < run.len() {
                break;
            }
            node = child;
        }
        found
    }

    /// The newest serial holding every key of `node`'s run (and those before it).
    pub(super) fn newest(&self, node: NodeIdx) -> u64 {
        self.nodes[node].newest
    }

    /// The chain position of `node`'s first key, and its parent (`None` for a child of the root).
    pub(super) fn start_and_parent(&self, node: NodeIdx) -> (usize, Option<NodeIdx>) {
        let Node { start, parent, .. } = self.nodes[node];
        (start, (parent != ROOT).then_some(parent))
    }

    /// Every serial holding `node`'s run, newest first.
    pub(super) fn holders_newest_first(&self, node: NodeIdx) -> Vec<u64> {
        let mut serials = Vec::new();
        let mut stack = vec![node];
        while let Some(at) = stack.pop() {
            serials.extend(self.nodes[at].ends.iter().copied());
            stack.extend(self.children(at));
        }
        serials.sort_unstable_by(|a, b| b.cmp(a));
        serials
    }

    /// Asserts the trie's shape and that it indexes exactly `chains` (`(keys, serial, end node)`, serials
    /// unique).
    #[cfg(test)]
    pub(super) fn check_invariants(&self, chains: &[(&[BlockKey], u64, Option<NodeIdx>)]) {
        let mut n_live = 0;
        for (idx, node) in self.nodes.iter().enumerate() {
            if idx == ROOT || self.free.contains(&idx) {
                continue;
            }
            n_live += 1;
            let parent = &self.nodes[node.parent];
            assert!(!node.keys.is_empty(), "node {idx} without keys");
            assert_eq!(node.start, parent.start + parent.keys.len());
            assert_eq!(self.edges.get(&(node.parent, node.keys[0])), Some(&idx));
            assert!(self.children(node.parent).any(|child| child == idx));
            assert!(
                !node.ends.is_empty() || node.n_children >= 2,
                "node {idx} neither ends a chain nor branches"
            );
            assert_eq!(self.children(idx).count(), node.n_children);
            assert!(
                self.children(idx)
                    .all(|child| self.nodes[child].parent == idx)
            );
            let newest = self.holders_newest_first(idx);
            assert_eq!(Some(&node.newest), newest.first(), "newest of node {idx}");
        }
        assert_eq!(self.edges.len(), n_live, "edges out of step");
        let n_ends: usize = self.nodes.iter().map(|node| node.ends.iter().count()).sum();
        let indexed: Vec<_> = chains
            .iter()
            .filter(|(keys, ..)| !keys.is_empty())
            .collect();
        assert_eq!(n_ends, indexed.len(), "ends out of step");
        assert!(
            chains
                .iter()
                .all(|(keys, _, end)| keys.is_empty() == end.is_none())
        );
        for (keys, serial, recorded) in indexed {
            let end = self.find_end(keys).expect("an indexed chain's end node");
            assert_eq!(Some(end), *recorded, "end node of serial {serial}");
            let node = &self.nodes[end];
            assert_eq!(node.start + node.keys.len(), keys.len());
            assert!(node.ends.iter().any(|other| other == serial));
            let mut at = end;
            while at != ROOT {
                let node = &self.nodes[at];
                assert_eq!(
                    node.keys[..],
                    keys[node.start..node.start + node.keys.len()]
                );
                at = node.parent;
            }
        }
    }

    /// The child of `node` whose run starts with `key`. A node with one child (the common case along a
    /// conversation's chain) compares that child's first key, with no hash probe; a node with more children
    /// asks the edge map at once, never reading a child (its node and its keys, two cache misses) that
    /// likely does not match.
    fn child(&self, node: NodeIdx, key: &BlockKey) -> Option<NodeIdx> {
        let Node {
            first_child,
            n_children,
            ..
        } = self.nodes[node];
        match n_children {
            0 => None,
            1 => (self.nodes[first_child].keys.first() == Some(key)).then_some(first_child),
            _ => self.edges.get(&(node, *key)).copied(),
        }
    }

    /// The node whose run ends with the last key of `keys` on the path they spell, if the trie holds them.
    #[cfg(test)]
    fn find_end(&self, keys: &[BlockKey]) -> Option<NodeIdx> {
        let (mut node, mut pos) = (ROOT, 0);
        while pos < keys.len() {
            node = *self.edges.get(&(node, keys[pos]))?;
            pos += self.nodes[node].keys.len();
        }
        (pos == keys.len() && node != ROOT).then_some(node)
    }

    fn children(&self, node: NodeIdx) -> impl Iterator<Item = NodeIdx> + '_ {
        std::iter::successors(
            Some(self.nodes[node].first_child).filter(|&child| child != NONE),
            |&child| Some(self.nodes[child].next_sibling).filter(|&next| next != NONE),
        )
    }

    /// The newest serial ending at `node` or below, from its ends and its children's.
    fn newest_below(&self, node: NodeIdx) -> u64 {
        let own = self.nodes[node].ends.iter().next_back().copied();
        self.children(node)
            .map(|child| self.nodes[child].newest)
            .chain(own)
            .max()
            .unwrap_or(0)
    }

    fn alloc(&mut self, node: Node) -> NodeIdx {
        match self.free.pop() {
            Some(idx) => {
                self.nodes[idx] = node;
                idx
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn link_child(&mut self, parent: NodeIdx, child: NodeIdx) {
        let first = self.nodes[parent].first_child;
        if first != NONE {
            self.nodes[first].prev_sibling = child;
        }
        let node = &mut self.nodes[child];
        node.parent = parent;
        node.prev_sibling = NONE;
        node.next_sibling = first;
        self.nodes[parent].first_child = child;
        self.nodes[parent].n_children += 1;
    }

    /// Puts `new` where `old` is in its parent's children (`new` is linked nowhere yet).
    fn replace_child(&mut self, old: NodeIdx, new: NodeIdx) {
        let Node {
            parent,
            prev_sibling,
            next_sibling,
            ..
        } = self.nodes[old];
        if prev_sibling == NONE {
            self.nodes[parent].first_child = new;
        } else {
            self.nodes[prev_sibling].next_sibling = new;
        }
        if next_sibling != NONE {
            self.nodes[next_sibling].prev_sibling = new;
        }
        let node = &mut self.nodes[new];
        node.parent = parent;
        node.prev_sibling = prev_sibling;
        node.next_sibling = next_sibling;
    }

    /// Splits `node`'s run after its first `at` keys (`0 < at < len`): a new node takes the head and the
    /// node's place below its parent; `node` keeps the tail, its children and its ends, below the new one.
    /// Returns the new node.
    fn split(&mut self, node: NodeIdx, at: usize) -> NodeIdx {
        debug_assert!(at > 0 && at < self.nodes[node].keys.len());
        let (start, parent, newest) = {
            let old = &self.nodes[node];
            (old.start, old.parent, old.newest)
        };
        let head_keys: Vec<BlockKey> = self.nodes[node].keys.drain(..at).collect();
        let first_key = head_keys[0];
        let mut head = Node::new(head_keys, start, parent);
        head.newest = newest;
        let head = self.alloc(head);
        self.replace_child(node, head);
        let _previous = self.edges.insert((parent, first_key), head);
        let tail_first = self.nodes[node].keys[0];
        self.nodes[node].start = start + at;
        self.link_child(head, node);
        let _previous = self.edges.insert((head, tail_first), node);
        head
    }

    /// Deletes a node without ends or children.
    fn delete_leaf(&mut self, node: NodeIdx) {
        let Node {
            parent,
            prev_sibling,
            next_sibling,
            ..
        } = self.nodes[node];
        if prev_sibling == NONE {
            self.nodes[parent].first_child = next_sibling;
        } else {
            self.nodes[prev_sibling].next_sibling = next_sibling;
        }
        if next_sibling != NONE {
            self.nodes[next_sibling].prev_sibling = prev_sibling;
        }
        self.nodes[parent].n_children -= 1;
        let first_key = self.nodes[node].keys[0];
        let _removed = self.edges.remove(&(parent, first_key));
        self.release(node);
    }

    /// Merges a node without ends and with one child into that child, which takes its keys and its place.
    fn merge_into_child(&mut self, node: NodeIdx) {
        let child = self.nodes[node].first_child;
        let parent = self.nodes[node].parent;
        let child_first = self.nodes[child].keys[0];
        let _removed = self.edges.remove(&(node, child_first));
        let mut keys = std::mem::take(&mut self.nodes[node].keys);
        let first_key = keys[0];
        keys.extend_from_slice(&self.nodes[child].keys);
        self.nodes[child].keys = keys;
        self.nodes[child].start = self.nodes[node].start;
        self.replace_child(node, child);
        let _previous = self.edges.insert((parent, first_key), child);
        self.release(node);
    }

    fn release(&mut self, node: NodeIdx) {
        self.nodes[node] = Node::new(Vec::new(), 0, NONE);
        self.free.push(node);
    }
}

/// How many leading keys `a` and `b` share.
fn common_len(a: &[BlockKey], b: &[BlockKey]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
