//! `Holders`: the serials of the catalog entries holding one block key, ascending. Almost every key is held
//! by one or two entries (a request's prompt-end and response-end checkpoints), so up to two are kept inline:
//! no heap buffer to allocate, free or miss in cache on the catalog's insert and remove paths, which a replay
//! runs for every block of every capture and eviction.

use std::collections::VecDeque;

/// Serials holding one block key, ascending.
#[derive(Clone, Debug)]
pub(super) enum Holders {
    /// Up to two serials, `serials[..len]`.
    Inline { len: u8, serials: [u64; 2] },
    /// More than two at some point: a deque, since evictions remove the oldest, near the front.
    Spilled(VecDeque<u64>),
}

impl Holders {
    /// One serial.
    pub(super) fn one(serial: u64) -> Holders {
        Holders::Inline {
            len: 1,
            serials: [serial, 0],
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

    /// Removes `serial` if held.
    pub(super) fn remove(&mut self, serial: u64) {
        match self {
            Holders::Inline { len, serials } => {
                let held = &serials[..usize::from(*len)];
                if let Some(pos) = held.iter().position(|&other| other == serial) {
                    serials.copy_within(pos + 1..usize::from(*len), pos);
                    *len -= 1;
                }
            }
            // An eviction removes the least recently used, most often the oldest holder: the front, found
            // without a bisection over a long deque (one cache miss per step).
            Holders::Spilled(deque) if deque.front() == Some(&serial) => {
                let _removed = deque.pop_front();
            }
            Holders::Spilled(deque) => {
                if let Ok(pos) = deque.binary_search(&serial) {
                    let _removed = deque.remove(pos);
                }
            }
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
        let mut holders = Holders::one(1);
        holders.push(4);
        assert!(matches!(holders, Holders::Inline { len: 2, .. }));
        holders.push(9);
        assert!(matches!(holders, Holders::Spilled(_)));
        holders.remove(4);
        holders.remove(7);
        assert_eq!(holders.iter().copied().collect::<Vec<_>>(), [1, 9]);
        assert_eq!(holders.iter().rev().copied().collect::<Vec<_>>(), [9, 1]);
        let mut inline = Holders::one(3);
        inline.push(5);
        inline.remove(3);
        assert_eq!(inline.iter().copied().collect::<Vec<_>>(), [5]);
        inline.remove(5);
        assert!(inline.is_empty());
        assert_eq!(holders, {
            let mut again = Holders::one(1);
            again.push(9);
            again
        });
    }
}
