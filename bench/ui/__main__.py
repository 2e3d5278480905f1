from bench.ui.run import main

main()
