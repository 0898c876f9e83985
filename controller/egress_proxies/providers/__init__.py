"""The providers as the controller sees them: the module contract (``client``), ansible-runner
(``runner``, its only importer) and what a run reports while it lasts (``transfers``)."""
