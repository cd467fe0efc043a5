//! The option this crate sets is mimalloc's purge delay: it reads that option's default
//! (10 ms in mimalloc v2, 1000 ms in v3) before and the documented "never" (-1) after.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[test]
fn never_purge_sets_the_purge_delay_to_never() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        let default = mimalloc_purge::purge_delay_ms();
        assert!(default == 10 || default == 1000, "{default}");
    }
    mimalloc_purge::never_purge();
    assert_eq!(mimalloc_purge::purge_delay_ms(), -1);
    // Memory freed now stays with the process and is reused.
    let reused: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8; 8 << 20]).collect();
    drop(reused);
    let again = vec![1u8; 8 << 20];
    assert_eq!(
        again.iter().map(|&b| usize::from(b)).sum::<usize>(),
        8 << 20
    );
}
