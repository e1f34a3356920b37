//! Admission gates: the waiting queue (FCFS or priority), the admission context (slots, free pages, credits,
//! watermark), the blocked head that only ready imports owning their capacity may pass, and the three answers
//! admit / pressure / impossible. A step's cost does not grow with the waiting queue.
