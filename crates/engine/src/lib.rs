//! The step loop, the restore coordinator, the `Executor` trait with the simulated executor, the three
//! policies (`ordinary`, `pages-only`, `reserved`) and the run metrics.
