//! `Holders`: the serials of the catalog entries whose block-key chain ends at one node of the block trie,
//! ascending. Almost every node ends one checkpoint or two (a conversation's checkpoints at the same
//! boundary), so up to two are kept inline: no heap buffer to allocate, free or miss in cache.

use std::collections::VecDeque;

/// Serials ending at one trie node, ascending.
#[derive(Clone, Debug)]
pub(super) enum Holders {
    /// Up to two serials, `serials[..len]`.
    Inline { len: u8, serials: [u64; 2] },
    /// More than two at some point: a deque, since evictions remove the oldest, near the front.
    Spilled(VecDeque<u64>),
}

impl Holders {
    /// No serial.
    pub(super) fn none() -> Holders {
        Holders::Inline {
            len: 0,
            serials: [0, 0],
        }
    }

    /// Appends `serial`, larger than every serial held.
    pub(super) fn push(&mut self, serial: u64) {
        debug_assert!(self.iter().last().is_none_or(|&last| last < serial));
        match self {
            Holders::Inline { len, serials } if usize::from(*len) < serials.len() => {
                serials[usize::from(*len)] = serial;
                *len += 1;
            }
            Holders::Inline { len, serials } => {
                let mut deque: VecDeque<u64> =
                    serials[..usize::from(*len)].iter().copied().collect();
                deque.push_back(serial);
                *self = Holders::Spilled(deque);
            }
            Holders::Spilled(deque) => deque.push_back(serial),
        }
    }

    /// Removes `serial`; `false` when it was not held.
    pub(super) fn remove(&mut self, serial: u64) -> bool {
        match self {
            Holders::Inline { len, serials } => {
                let held = &serials[..usize::from(*len)];
                let Some(pos) = held.iter().position(|&other| other == serial) else {
                    return false;
                };
                serials.copy_within(pos + 1..usize::from(*len), pos);
                *len -= 1;
                true
            }
            // An eviction removes the least recently used, most often the oldest holder: the front, found
            // without a bisection over a long deque.
            Holders::Spilled(deque) if deque.front() == Some(&serial) => {
                deque.pop_front().is_some()
            }
            Holders::Spilled(deque) => match deque.binary_search(&serial) {
                Ok(pos) => deque.remove(pos).is_some(),
                Err(_) => false,
            },
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Holders::Inline { len, .. } => *len == 0,
            Holders::Spilled(deque) => deque.is_empty(),
        }
    }

    /// The serials, ascending.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &u64> {
        let (front, back) = match self {
            Holders::Inline { len, serials } => (&serials[..usize::from(*len)], &[][..]),
            Holders::Spilled(deque) => deque.as_slices(),
        };
        front.iter().chain(back)
    }
}

impl PartialEq for Holders {
    fn eq(&self, other: &Holders) -> bool {
        self.iter().eq(other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::Holders;

    #[test]
    fn holders_keep_serials_ascending_inline_and_spilled() {
        let mut holders = Holders::none();
        assert!(holders.is_empty());
        holders.push(1);
        holders.push(4);
        assert!(matches!(holders, Holders::Inline { len: 2, .. }));
        holders.push(9);
        assert!(matches!(holders, Holders::Spilled(_)));
        assert!(holders.remove(4));
        assert!(!holders.remove(7));
        assert_eq!(holders.iter().copied().collect::<Vec<_>>(), [1, 9]);
        assert_eq!(holders.iter().rev().copied().collect::<Vec<_>>(), [9, 1]);
        assert!(holders.remove(1), "the front of a spilled list");
        holders.push(11);
        assert_eq!(holders.iter().copied().collect::<Vec<_>>(), [9, 11]);
        let mut inline = Holders::none();
        inline.push(3);
        inline.push(5);
        assert!(inline.remove(3));
        assert_eq!(inline.iter().copied().collect::<Vec<_>>(), [5]);
        assert!(inline.remove(5));
        assert!(!inline.remove(5));
        assert!(inline.is_empty());
        assert_eq!(holders, {
            let mut again = Holders::none();
            again.push(9);
            again.push(11);
            again
        });
    }
}
