from tensorfold_bench.cli import main

main()
