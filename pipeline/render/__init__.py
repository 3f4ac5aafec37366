"""render: what reports look like to people: tables in text, Markdown, CSV and JSON, and plots."""
