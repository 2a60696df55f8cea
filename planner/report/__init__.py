"""What a search answers, for people and launchers: the Plan document (``plan``), the reasons the
best layout won (``explain``), launcher configs (``export``) and charts (``chart``)."""
