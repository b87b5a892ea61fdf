"""The servers measured: launching a fresh one per run (`launcher`, tied to tfbench's life by
`lifeline`, its port checked by `ports`), a variant's engine source (`worktree`), and what a
running server says about itself (`identity`)."""
