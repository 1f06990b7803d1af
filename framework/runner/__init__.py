"""Running a recipe: ``RipienoCLI`` (LightningCLI with ripieno's links, guards and one-line errors).

``command`` is the LightningCLI subclass; the other modules are its checks (``config_errors``,
``monitor_check``, ``resume_check``), its run folder and logs (``run_folders``, ``run_logs``,
``spawn_results``), the optimizer options (``optimizer_config``), the shipped recipes (``recipes``),
the one door to Lightning's private names (``lightning_private``) and what the tuning and benchmark
engines share with it (``fingerprints``, ``store_folders``, ``yaml_files``, ``interrupts``). It lies
below the engines, which run recipes through it, and below the ``ripieno`` command (``cli``).
"""
