//! A reference executor step allocates nothing per context page it reads (issue 36, item 4: the model
//! allocated a byte buffer per run of consecutive pages, so a context whose pages are scattered through
//! the pool allocated once per page every step): a decode over 16 scattered pages makes exactly as many
//! allocations as one over 4, on one rank and on two. Counted by a global allocator that counts each
//! thread's allocations, with the step run inside a one-thread rayon pool so that all its work, the
//! model's parallel page reads included, runs on the thread that counts.
#![allow(
    unsafe_code,
    reason = "a counting global allocator forwards to the system allocator"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use engine::{DecodeWork, Executor, PageTables, PrefillWork, ReferenceExecutor, StepBatch};
use kv_pool::{HostStorage, PageId, RequestId};
use reference_model::ReferenceConfig;

/// The system allocator, counting each thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call forwards to `System` unchanged; the counter is a const-initialized thread local,
// which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _counted = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _counted = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _counted = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// One request's context: `n_blocks` full blocks on every other page from `first` (no two consecutive, so
/// each is a run of its own), then one more page for the decoded tokens, and a state page.
struct Context {
    request: RequestId,
    table: Vec<PageId>,
    state: [PageId; 1],
    prompt: Vec<u32>,
}

impl Context {
    fn new(request: u64, first: u32, n_blocks: u32, block_tokens: u32) -> Context {
        Context {
            request: RequestId(request),
            table: (0..=n_blocks).map(|i| PageId(first + 2 * i)).collect(),
            state: [PageId(first + 2 * n_blocks + 1)],
            prompt: (0..n_blocks * block_tokens).map(|t| t * 7 + 1).collect(),
        }
    }

    fn pages(&self) -> PageTables<'_> {
        PageTables {
            block_table: &self.table,
            windows: &[],
            fixed: &self.state,
        }
    }
}

/// Prefills `context` in one step, then decodes twice; the allocations of the second decode, counted
/// with the whole step on one thread.
fn decode_allocations(
    executor: &mut ReferenceExecutor,
    storage: &HostStorage,
    context: &Context,
    pool: &rayon::ThreadPool,
) -> u64 {
    let n_prompt = context.prompt.len() as u32;
    let prefill = StepBatch {
        prefills: vec![PrefillWork {
            request: context.request,
            first_pos: 0,
            n_tokens: n_prompt,
            draft_replay_tokens: 0,
            tokens: &context.prompt,
            pages: context.pages(),
            samples: true,
        }],
        decodes: Vec::new(),
        logits_only: Vec::new(),
    };
    let mut token = executor.execute(&prefill, storage).unwrap().tokens[0].1;
    let mut counted = 0;
    for context_tokens in [n_prompt, n_prompt + 1] {
        let pending = [token];
        let decode = StepBatch {
            prefills: Vec::new(),
            decodes: vec![DecodeWork {
                request: context.request,
                context_tokens,
                n_tokens: 1,
                draft_replay_tokens: 0,
                tokens: &pending,
                pages: context.pages(),
            }],
            logits_only: Vec::new(),
        };
        let (output, n) = pool.install(|| {
            let before = allocations();
            let output = executor.execute(&decode, storage);
            (output, allocations() - before)
        });
        token = output.unwrap().tokens[0].1;
        counted = n;
    }
    counted
}

#[test]
fn a_reference_decode_allocates_nothing_per_context_page() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for context_parallel in [1, 2] {
        let config = ReferenceConfig {
            context_parallel,
            ..ReferenceConfig::tiny()
        };
        let mut executor = ReferenceExecutor::new(config).unwrap();
        let bytes_per_page = executor.bytes_per_page().unwrap() as usize;
        let storage = HostStorage::new(context_parallel, 128, bytes_per_page).unwrap();
        let block = config.block_tokens();
        let short = Context::new(1, 1, 4, block);
        let long = Context::new(2, 20, 16, block);
        let short_allocations = decode_allocations(&mut executor, &storage, &short, &pool);
        let long_allocations = decode_allocations(&mut executor, &storage, &long, &pool);
        // The counter counts: a step allocates its activations.
        assert!(short_allocations > 0);
        assert_eq!(
            long_allocations, short_allocations,
            "{context_parallel} ranks: a decode over 16 scattered pages against one over 4"
        );
    }
}
