//! What the kernel tests share: random stored matrices, and running a product on a pool of a
//! given size (the bits must not depend on it).

#![allow(dead_code)]

pub mod matrices;

pub fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool of this size")
        .install(f)
}
