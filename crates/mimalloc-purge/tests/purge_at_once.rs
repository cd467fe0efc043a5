//! `purge_at_once` sets mimalloc's purge delay to 0 (its own process: the option is global).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[test]
fn purge_at_once_sets_the_purge_delay_to_zero() {
    mimalloc_purge::purge_at_once();
    assert_eq!(mimalloc_purge::purge_delay_ms(), 0);
    let freed = vec![7u8; 64 << 20];
    drop(freed);
    let again = vec![1u8; 64 << 20];
    assert_eq!(
        again.iter().map(|&b| usize::from(b)).sum::<usize>(),
        64 << 20
    );
}
