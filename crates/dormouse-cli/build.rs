//! The commit this program is built from, for its `--version`.

fn main() {
    build_commit::emit();
}
