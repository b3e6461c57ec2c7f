from postjob_sa.cli import main

main()
