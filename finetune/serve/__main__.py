"""`python -m finetune.serve`: see `finetune.serve`."""

from finetune.serve.app import main

main()
