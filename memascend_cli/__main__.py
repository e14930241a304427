from memascend_cli.app import main

main()
