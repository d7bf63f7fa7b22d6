-- Seed rows for the demo schema: they exist before capture starts (snapshot path).
INSERT INTO shop.customers (email, full_name, tier) VALUES
    ('ada@example.com', 'Ada Lovelace', 'gold'),
    ('alan@example.com', 'Alan Turing', 'standard'),
    ('grace@example.com', 'Grace Hopper', 'gold'),
    ('edsger@example.com', 'Edsger Dijkstra', 'standard')
ON CONFLICT (email) DO NOTHING;

INSERT INTO shop.products (sku, name, description, price, attributes) VALUES
    ('KB-01', 'Keyboard', repeat('A mechanical keyboard with tactile switches. ', 200), 89.90,
     '{"color": "black", "layout": "ISO"}'),
    ('MS-01', 'Mouse', repeat('An ergonomic wireless mouse. ', 200), 39.50, '{"dpi": 1600}'),
    ('MN-27', 'Monitor 27"', repeat('A 27 inch IPS monitor. ', 200), 249.00, NULL)
ON CONFLICT (sku) DO NOTHING;

INSERT INTO shop.orders (customer_id, status, total)
SELECT c.id, 'paid', 129.40 FROM shop.customers c WHERE c.email = 'ada@example.com'
  AND NOT EXISTS (SELECT 1 FROM shop.orders);

INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price)
SELECT o.id, l.line_no, p.id, l.quantity, p.price
FROM shop.orders o
CROSS JOIN (VALUES (1, 'KB-01', 1), (2, 'MS-01', 1)) AS l (line_no, sku, quantity)
JOIN shop.products p ON p.sku = l.sku
ON CONFLICT DO NOTHING;
