"""The staleness workflow's commands (docs/workflow.md), outside the library.

``rhythm`` (read the produce/store/consume rhythm from config files, verl config folders and launch
scripts: ``verl_sources``, ``launch_script`` over the bash reader ``bash_words``; its planner is ``plan``),
``audit`` (reconcile the ledger records in logs) and ``perturb`` (prove the drop path runs), with the
config readers (``_config_files``), the known framework keys (``_known_keys``) and the printer they
share (``output``). ``pyfast_buffer.cli`` registers each command; nothing in the library imports this
package.
"""
