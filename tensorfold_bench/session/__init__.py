"""A session: the shared engine flags and device defaults, the variants and their run order,
what each variant runs against, and the driver that plays a scenario's runs through them."""
